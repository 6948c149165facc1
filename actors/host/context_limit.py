"""A session's context limit: the most tokens it can hold where its policy keeps every token.

Primitives:
- ``session_limit(config, executor, residency) -> int | None``: the backend's ``kv_budget_tokens``
  (a session may fill the budget alone, the idle others parked for it), or the engine's room for
  one session where that is smaller (``Executor.session_cells``: llama.cpp's split layout gives a
  session a stream of ``n_ctx / n_seq_max`` cells); None where the policy bounds what the session
  keeps (kvres's eviction, or the engine's), so it never runs into one.
- ``check_prompt(config, executor, session_id, held, n, limit)``: ``ContextLengthError`` when
  ``n`` more tokens would take a session holding ``held`` past ``limit``, naming the numbers, the
  bound and what to do instead.

A prompt past the limit is refused before any of it is appended (HTTP: 400,
``context_length_exceeded``); a generation stops at it with finish_reason "length", as at its
``max_tokens``. Room the others hold for now is another matter: that waits, or is a
``BackendFullError`` (HTTP 429), because it frees.
"""

from __future__ import annotations

from kvres.policy import ContextLengthError
from kvres.policy.residency import Residency

from ..config import BackendConfig
from ..engines.executor import Executor


def session_limit(config: BackendConfig, executor: Executor, residency: Residency) -> int | None:
    if residency.enforced_budget_tokens is not None:
        return None
    cells = executor.session_cells()
    return config.kv_budget_tokens if cells is None else min(config.kv_budget_tokens, cells)


def check_prompt(config: BackendConfig, executor: Executor, session_id: str, held: int, n: int,
                 limit: int | None) -> None:
    if limit is None or held + n <= limit:
        return
    cells = executor.session_cells()
    bound = (f"a session's KV stream of {cells} cells (kv_layout='split': n_ctx / n_seq_max)"
             if cells is not None and cells < config.kv_budget_tokens else f"kv_budget_tokens={config.kv_budget_tokens}")
    raise ContextLengthError(
        f"session {session_id!r} holds {held} tokens and the call brings {n} more: {held + n} is past the "
        f"{limit} tokens one session can hold on backend {config.name!r} ({bound}) with a policy that keeps "
        "every token resident; nothing was appended. Roll the session back or start a new one, or open it "
        "with a policy that evicts (SessionPolicy kind 'streaming' or 'scored')")
