"""Passkey prompts, budgets and records: what every passkey run prepares and reports.

Primitives:
- ``EvalConfig(block_size=4, sink_tokens=4, recent_extra=2, rebase=("streaming",))``: the eviction
  setup every method shares; ``recent_tokens(task)`` = the question + ``recent_extra`` tokens
  (protected), ``observation_window(task)`` = the question (SnapKV's window).
- ``make_tasks(family, depths, per_cell, n_tokens)``: the benchmark's prompts, ``per_cell`` per
  needle depth (seeds 1000 + depth in percent, disjoint from the tests' seed 0).
- ``budget_tokens(task, fraction, cfg)``: the resident budget, ``ceil(fraction * n_tokens)``, at
  least what a policy must protect (sinks + recent window + one block).
- ``Record``: one answer (engine, family, method, budget, depth, right or wrong, resident tokens);
  ``accuracy(records, **match)``; ``decode_answer(ids)``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from models import passkey_tasks as pt


@dataclass(frozen=True)
class EvalConfig:
    block_size: int = 4
    sink_tokens: int = 4
    recent_extra: int = 2  # recent window = the question + this many tokens before it
    rebase: tuple[str, ...] = ("streaming",)  # methods whose evictions re-base positions

    def question_tokens(self, task: pt.PasskeyTask) -> int:
        return task.question_span[1] - task.question_span[0]

    def recent_tokens(self, task: pt.PasskeyTask) -> int:
        return self.question_tokens(task) + self.recent_extra

    def observation_window(self, task: pt.PasskeyTask) -> int:
        return self.question_tokens(task)

    def floor(self, task: pt.PasskeyTask) -> int:
        """The smallest budget a policy accepts: sinks + recent window + one block."""
        return self.sink_tokens + self.recent_tokens(task) + self.block_size


def make_tasks(family: int, depths: Sequence[float], per_cell: int, n_tokens: int) -> list[pt.PasskeyTask]:
    tasks: list[pt.PasskeyTask] = []
    for d in depths:
        tasks += pt.fixed_task_set(family, per_cell, seed=1000 + round(100 * d), n_tokens=n_tokens, depth=d)
    return tasks


def budget_tokens(task: pt.PasskeyTask, fraction: float, cfg: EvalConfig) -> int:
    return max(cfg.floor(task), math.ceil(fraction * task.n_tokens - 1e-9))


@dataclass(frozen=True)
class Record:
    engine: str
    family: int
    method: str
    budget: float  # fraction of the prompt (1.0 for the full cache)
    budget_tokens: int  # what the session was given (genai: its whole-block cache size)
    resident_tokens: int | None  # resident after the answer (None: the engine manages its KV)
    peak_resident_tokens: int | None
    depth: float
    n_tokens: int
    seed_index: int
    correct: bool
    answer: str
    expected: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def decode_answer(ids: Sequence[int]) -> str:
    """The answer as text; ids outside the task vocabulary show as ``<id>``."""
    return " ".join(pt.VOCAB[i] if 0 <= i < len(pt.VOCAB) else f"<{i}>" for i in ids)


def accuracy(records: Iterable[Record], **match: Any) -> float:
    sel = [r for r in records if all(getattr(r, k) == v for k, v in match.items())]
    if not sel:
        raise ValueError(f"no records match {match}")
    return sum(r.correct for r in sel) / len(sel)
