"""The fleet workload: S chat sessions with H-token histories, turn-shaped traffic from T users.

Primitives:
- ``Workload(sessions, history, turns, user_tokens, reply_tokens, users, shared_prefix=0)``: the
  sizes; ``history_of(i, vocab)`` (session ``i``'s starting history: its first ``shared_prefix``
  tokens are the same for every session, a system prompt), ``user_turn(i, k, vocab)`` (the tokens
  of session ``i``'s ``k``-th user message), ``sessions_of(u)`` (the sessions user thread ``u``
  drives, one after another, round robin: user ``u`` owns sessions ``u, u + T, ...``),
  ``schedule()`` (every turn as ``(session, k)``, in the order one-at-a-time baselines take them),
  ``tokens_per_session`` (a session's log after its last turn).
- ``TurnTiming(session, turn, start_s, first_token_s, end_s)``: one turn as its user saw it
  (seconds since the run started); ``ttft_s``, ``latency_s``.
- ``summarize(timings, wall_s) -> dict``: turns/s, time to first token and turn latency p50 / p99.

A turn appends the user's message (``user_tokens`` new tokens) and generates a reply of
``reply_tokens`` tokens (greedy, end-of-generation ignored: the weights are noise), which stays in
the session's log. Token ids are seeded random ids of the model's vocabulary, so every engine sees
the same tokens.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

import numpy as np

SHARED_SEED = 1_000_003


@dataclass(frozen=True)
class Workload:
    sessions: int = 16
    history: int = 512
    turns: int = 3
    user_tokens: int = 32
    reply_tokens: int = 16
    users: int = 8
    shared_prefix: int = 0

    def __post_init__(self) -> None:
        if min(self.sessions, self.history, self.turns, self.user_tokens, self.reply_tokens, self.users) < 1:
            raise ValueError(f"every size of a workload must be >= 1: {self}")
        if not 0 <= self.shared_prefix <= self.history:
            raise ValueError(f"shared_prefix must be in [0, history={self.history}], got {self.shared_prefix}")
        if self.users > self.sessions:
            raise ValueError(f"users ({self.users}) must not exceed sessions ({self.sessions}): "
                             "a session takes one call at a time")

    @property
    def tokens_per_session(self) -> int:
        return self.history + self.turns * (self.user_tokens + self.reply_tokens)

    @property
    def total_turns(self) -> int:
        return self.sessions * self.turns

    def history_of(self, i: int, vocab: int) -> list[int]:
        shared = np.random.default_rng(SHARED_SEED).integers(3, vocab, size=self.shared_prefix)
        own = np.random.default_rng(i).integers(3, vocab, size=self.history - self.shared_prefix)
        return [int(t) for t in np.concatenate([shared, own])]

    def user_turn(self, i: int, k: int, vocab: int) -> list[int]:
        return [int(t) for t in np.random.default_rng((i, k, 7)).integers(3, vocab, size=self.user_tokens)]

    def sessions_of(self, u: int) -> list[int]:
        return list(range(u, self.sessions, self.users))

    def schedule(self) -> list[tuple[int, int]]:
        return [(i, k) for k in range(self.turns) for i in range(self.sessions)]


@dataclass(frozen=True)
class TurnTiming:
    session: int
    turn: int
    start_s: float
    first_token_s: float
    end_s: float

    @property
    def ttft_s(self) -> float:
        return self.first_token_s - self.start_s

    @property
    def latency_s(self) -> float:
        return self.end_s - self.start_s


def _pct(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


def summarize(timings: list[TurnTiming], wall_s: float) -> dict[str, Any]:
    lat = [t.latency_s for t in timings]
    ttft = [t.ttft_s for t in timings]
    return {
        "turns": len(timings),
        "wall_s": wall_s,
        "turns_per_s": len(timings) / wall_s if wall_s > 0 else float("nan"),
        "ttft_p50_ms": statistics.median(ttft) * 1e3 if ttft else float("nan"),
        "ttft_p99_ms": _pct(ttft, 99) * 1e3,
        "latency_p50_ms": statistics.median(lat) * 1e3 if lat else float("nan"),
        "latency_p99_ms": _pct(lat, 99) * 1e3,
    }
