"""The llama.cpp KV layout a backend runs with when its config leaves it to kvres (``kv_layout=None``).

Primitives:
- ``SPLIT_MIN_SESSIONS`` (4) and ``SPLIT_MIN_STREAM_TOKENS`` (512): the sizes from which the
  split layout pays: that many sessions resident at once, each with a stream that long.
- ``LayoutChoice(layout, reason, chosen)``: the layout, why (for the start log), and whether kvres
  chose it (False: the config named it).
- ``choose_kv_layout(n_ctx, n_seq_max, sliding_window=False, spills=False, evicting_sessions=False,
  session_tokens=None) -> LayoutChoice``: the pure decision on the backend's sizes. Split where many
  sessions are resident (``n_seq_max >= SPLIT_MIN_SESSIONS``) and none must evict from its middle:
  each session's stream (``n_ctx / n_seq_max``) holds at least ``SPLIT_MIN_STREAM_TOKENS`` and at
  least what one session may hold on the unified cache (``session_tokens``, the backend's
  ``kv_budget_tokens``: choosing split never lowers a session's context), the model
  has no sliding window (the split layout is not for one), the KV tier decision does not spill (a
  spilling backend runs its sessions with eviction) and the sessions it opens by default keep
  every token (``evicting_sessions``: a cluster whose ``default_policy`` evicts). Unified otherwise.
- ``llama_kv_layout(config, model_path=None, spills=False, evicting_sessions=False) -> LayoutChoice``:
  a llama.cpp config's own layout where it names one, else the choice on its sizes (the model's
  sliding window read from its GGUF where a path is given and the file reads as one). Which
  engines have layouts at all is the registry's to say (``engine_registry.kv_layout_of``).
- ``has_sliding_window(model_path) -> bool``: the GGUF's layers include windowed ones (False where
  no path is given or the file does not read as a GGUF).
- ``log_layout_choice(backend, choice)``: a choice kvres made, with its reason (``kvres.capacity``).

In the unified cache every token's attention walks every occupied cell of every session, so a chat
fleet of many resident sessions decodes and prefills faster split (docs/notes.md, Fleet); but a
split session holds at most its stream and cannot evict from its middle (streaming and scored
policies degrade to none there, or are refused when strict), so small streams stay unified.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from kvres.actors.config import BackendConfig

Layout = Literal["unified", "split"]

logger = logging.getLogger("kvres.capacity")

SPLIT_MIN_SESSIONS = 4
SPLIT_MIN_STREAM_TOKENS = 512


@dataclass(frozen=True)
class LayoutChoice:
    layout: Layout
    reason: str
    chosen: bool = True

    def as_dict(self) -> dict[str, object]:
        return {"layout": self.layout, "reason": self.reason, "chosen_by_kvres": self.chosen}


def choose_kv_layout(n_ctx: int, n_seq_max: int, sliding_window: bool = False, spills: bool = False,
                     evicting_sessions: bool = False, session_tokens: int | None = None) -> LayoutChoice:
    stream = n_ctx // n_seq_max
    if n_seq_max < SPLIT_MIN_SESSIONS:
        return LayoutChoice("unified", f"n_seq_max={n_seq_max} < {SPLIT_MIN_SESSIONS}: few sessions resident at once")
    if sliding_window:
        return LayoutChoice("unified", "the model has a sliding window (the split layout is not for one)")
    if spills:
        return LayoutChoice("unified", "the KV tier decision spills: sessions evict from their middle")
    if evicting_sessions:
        return LayoutChoice("unified", "the default session policy evicts from a session's middle")
    if stream < SPLIT_MIN_STREAM_TOKENS:
        return LayoutChoice("unified", f"a split stream would hold n_ctx / n_seq_max = {stream} tokens "
                                       f"< {SPLIT_MIN_STREAM_TOKENS}: sessions would outgrow it or have to evict")
    if session_tokens is not None and stream < session_tokens:
        return LayoutChoice("unified", f"a split stream would hold n_ctx / n_seq_max = {stream} tokens, less than "
                                       f"one session may hold (kv_budget_tokens={session_tokens})")
    return LayoutChoice("split", f"n_seq_max={n_seq_max} sessions resident, each a stream of {stream} tokens "
                                 f"(>= {SPLIT_MIN_STREAM_TOKENS}) no other session's attention walks")


def has_sliding_window(model_path: Path | None) -> bool:
    if model_path is None:
        return False
    from kvres.actors.model_files import layout_from_gguf

    try:
        return layout_from_gguf(model_path).windowed_layers > 0
    except (OSError, ValueError):  # not a GGUF kvres can read: the engine says so when it loads it
        return False


def llama_kv_layout(config: BackendConfig, model_path: Path | None = None, spills: bool = False,
                    evicting_sessions: bool = False) -> LayoutChoice:
    if config.kv_layout is not None:
        return LayoutChoice(config.kv_layout, "set in the backend's config", chosen=False)
    return choose_kv_layout(config.n_ctx, config.n_seq_max, sliding_window=has_sliding_window(model_path),
                            spills=spills, evicting_sessions=evicting_sessions, session_tokens=config.kv_budget_tokens)


def log_layout_choice(backend: str, choice: LayoutChoice) -> None:
    if choice.chosen:
        logger.info("backend %s: KV layout %s (%s)", backend, choice.layout, choice.reason,
                    extra={"kvres_kv_layout": choice.as_dict()})
