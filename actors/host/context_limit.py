"""A session's context limit: the most tokens it can hold where no eviction keeps it within one.

Primitives:
- ``session_limit(config, executor, residency) -> int | None``: where the policy keeps every token,
  the backend's ``kv_budget_tokens`` (a session may fill the budget alone, the idle others parked
  for it), or the engine's room for one session where that is smaller (``session_cells``:
  llama.cpp's split layout gives a session a stream of ``n_ctx / n_seq_max`` cells; openvino-genai
  a KV pool that each request fills with the session's whole log). None where the policy bounds
  what the session keeps (kvres's eviction), so it never runs into one. The eviction of an engine
  that manages its KV (openvino-genai, kind "engine") bounds only what a generation keeps, not the
  prompt each request prefills: such a session's limit is the engine's room for one session.
- ``check_prompt(config, executor, session_id, held, n, limit, residency)``: ``ContextLengthError``
  when ``n`` more tokens would take a session holding ``held`` past ``limit``, naming the numbers,
  the bound and what to do instead, from Python and over HTTP (``kvres serve``'s options).

A prompt past the limit is refused before any of it is appended (HTTP: 400,
``context_length_exceeded``); a generation stops at it with finish_reason "length", as at its
``max_tokens``. Room the others hold for now is another matter: that waits, or is a
``BackendFullError`` (HTTP 429), because it frees.
"""

from __future__ import annotations

from kvres.policy import ContextLengthError
from kvres.policy.residency import Residency

from ..config import BackendConfig
from ..engines.executor import EngineManagedExecutor, Executor


def _engine_prefills_all(executor: Executor | EngineManagedExecutor, residency: Residency) -> bool:
    """The engine evicts for the session, but only as it generates: each request prefills the whole log."""
    return isinstance(executor, EngineManagedExecutor) and residency.engine_eviction() is not None


def session_limit(config: BackendConfig, executor: Executor | EngineManagedExecutor,
                  residency: Residency) -> int | None:
    cells = executor.session_cells()
    if _engine_prefills_all(executor, residency):
        return cells
    if residency.enforced_budget_tokens is not None:
        return None
    return config.kv_budget_tokens if cells is None else min(config.kv_budget_tokens, cells)


def check_prompt(config: BackendConfig, executor: Executor | EngineManagedExecutor, session_id: str, held: int,
                 n: int, limit: int | None, residency: Residency) -> None:
    if limit is None or held + n <= limit:
        return
    cells = executor.session_cells()
    managed = isinstance(executor, EngineManagedExecutor)
    by_engine = cells is not None and (cells < config.kv_budget_tokens or _engine_prefills_all(executor, residency))
    if not by_engine:
        bound = f"kv_budget_tokens={config.kv_budget_tokens}"
    elif managed:
        bound = f"the {executor.engine} KV pool of {cells} cells, which each request fills with the session's whole log"
    else:
        bound = f"a session's KV stream of {cells} cells (kv_layout='split': n_ctx / n_seq_max)"
    policy = ("with a policy the engine evicts by, which it does only as it generates"
              if _engine_prefills_all(executor, residency) else "with a policy that keeps every token resident")
    if not managed and by_engine:  # a split stream: no eviction from a session's middle, a longer stream instead
        instead = (" (over HTTP: drop the oldest turns from the messages, or use another X-Session-Id), or give "
                   "each session a longer stream: a larger n_ctx per n_seq_max in the BackendConfig (kvres serve "
                   "--config), or with kvres serve --model / kvres chat --model more --kv-memory where the memory "
                   "bounds it")
    elif not managed:
        instead = (", or open it with a policy that evicts (SessionPolicy kind 'streaming' or 'scored'; for the "
                   "sessions of kvres serve, its KvresConfig.default_policy: kvres serve --config "
                   "'{\"default_policy\": {\"kind\": \"streaming\", \"budget_tokens\": N}, ...}')")
    elif not by_engine:  # a session the engine evicts in is bounded by the engine's room alone
        room = "" if cells is None else f", up to {cells} tokens"
        instead = f", or open it with a policy the engine evicts by (SessionPolicy kind 'engine'{room})"
    else:
        instead = ""
    raise ContextLengthError(
        f"session {session_id!r} holds {held} tokens and the call brings {n} more: {held + n} is past the "
        f"{limit} tokens one session can hold on backend {config.name!r} ({bound}) {policy}; nothing was "
        f"appended. Roll the session back or start a new one{instead}")
