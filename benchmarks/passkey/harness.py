"""Strict passkey-retrieval evaluation of eviction policies on a kvres executor.

Primitives:
- ``METHODS``: ``full`` (no eviction), ``streaming`` (sinks + most recent tokens), ``h2o``
  (attention each key received from the prompt rows *before* the question, summed), ``h2o_norm``
  (the same divided by how many of those rows could see the key: H2O without its bias towards
  early keys, like genai's NORM_SUM), ``snapkv`` (attention from the question rows, summed over
  layers / heads / rows, max-pooled, kernel 7).
- ``EvalConfig(block_size=4, sink_tokens=4, recent_extra=2, kernel=7, rebase=("streaming",))``.
- ``key_scores_llama(executor, task)`` / ``key_scores_openvino(executor, task)`` -> ``KeyScores``:
  one float per prompt token for each scored method, computed by the engine itself
  (llama.cpp: ``LlamaExecutor.attention`` over every prompt row; OpenVINO: the executor's scoring
  pass, ``block_attention_scores`` on one-token ranges).
- ``prompt_blocks(n, recent_start, cfg)``: the planner's blocks over the first ``n`` tokens: the
  sinks and the recent window (the question + ``recent_extra`` tokens) are their own protected
  blocks, the middle is cut into ``block_size`` blocks.
- ``plan_for(task, method, budget_tokens, scores, caps, cfg) -> Plan | None``: ``plan_hot_set``
  over those blocks (``None`` for ``full``).
- ``answer_strict(executor, task, plan, rebase) -> (answer ids, resident tokens)``: the STRICT
  protocol (docs/architecture.md, How correctness is judged): the session holds the prompt without
  its last token, the plan is applied (``apply_plan``), then the last prompt token is decoded
  against the evicted cache, so the first answer digit is computed from what the policy kept;
  greedy decoding of the answer follows.
- ``evaluate(executor, tasks, methods, budgets, scorer, cfg) -> list[Record]``: every task under
  every (method, budget fraction); ``accuracy(records, **filters)``; ``decode_answer(ids)``.

The resident budget is a fraction of the prompt: ``round(fraction * n_tokens)`` tokens are resident
when the first answer token is computed (the last prompt token included). Protected tokens (sinks
and the recent window) count against it. All methods share one ``StreamPolicy`` (sinks 4, recent =
question + ``recent_extra``), so streaming is the same plan with no scores (docs/policies.md, T2:
without scores the plan is exactly T1's). Streaming re-bases positions after eviction
(StreamingLLM); the scored methods keep the evicted positions as gaps, as H2O / SnapKV (and genai's
own eviction) do. On the passkey model re-basing costs SnapKV a few points at a 10% budget (family
1, 50 middle-third prompts, blocks of 4: 96% with gaps, 86% re-based). The failures re-based kept
every answer digit and got one digit wrong: a lossy-eviction effect on this small model, not a lost
needle.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from kvres.actors.executor import apply_plan
from kvres.policy import (
    Block,
    BlockFlag,
    Capabilities,
    Plan,
    PlanInput,
    Range,
    StreamPolicy,
    plan_hot_set,
    split_into_blocks,
)
from kvres.policy.scoring import H2OAccumulator, block_scores, pool_1d, snapkv_key_scores
from models import passkey_tasks as pt

METHODS = ("full", "streaming", "h2o", "h2o_norm", "snapkv")
SCORED = ("h2o", "h2o_norm", "snapkv")


@dataclass(frozen=True)
class EvalConfig:
    block_size: int = 4
    sink_tokens: int = 4
    recent_extra: int = 2  # recent window = the question + this many tokens before it
    kernel: int = 7  # SnapKV max-pool kernel
    rebase: tuple[str, ...] = ("streaming",)  # methods whose evictions re-base positions

    def stream_policy(self, recent_tokens: int) -> StreamPolicy:
        return StreamPolicy(True, sink_tokens=self.sink_tokens, recent_tokens=recent_tokens)


@dataclass(frozen=True)
class KeyScores:
    h2o: np.ndarray  # (n_tokens,) attention received from prompt rows before the question
    snapkv: np.ndarray  # (n_tokens,) pooled attention received from the question rows
    question_start: int

    @property
    def h2o_norm(self) -> np.ndarray:
        """H2O per observing row: key k is seen by rows k..question_start-1."""
        seen = np.maximum(self.question_start - np.arange(self.h2o.shape[0]), 0)
        return np.divide(self.h2o, seen, out=np.zeros_like(self.h2o), where=seen > 0)

    def of(self, method: str) -> np.ndarray:
        if method not in SCORED:
            raise ValueError(f"no key scores for method {method!r}")
        return np.asarray(getattr(self, method))


@dataclass(frozen=True)
class Record:
    engine: str
    family: int
    method: str
    budget: float  # fraction of the prompt
    budget_tokens: int
    resident_tokens: int  # resident when the first answer token was computed
    depth: float
    n_tokens: int
    seed_index: int
    correct: bool
    answer: str
    expected: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


Scorer = Callable[[Any, pt.PasskeyTask], KeyScores]


# -- scores ------------------------------------------------------------------------------------
def _snapkv_from_mass(mass: np.ndarray, kernel: int) -> np.ndarray:
    return pool_1d(mass, kernel, "max")


def key_scores_llama(executor: Any, task: pt.PasskeyTask, kernel: int = 7) -> KeyScores:
    """Both score kinds from one llama.cpp attention capture over every prompt row."""
    n, q0 = task.n_tokens, task.question_span[0]
    sid = "__passkey_score__"
    executor.open_session(sid)
    try:
        executor.append(sid, task.prompt_ids)
        cap = executor.attention(sid, window=n)
    finally:
        executor.close_session(sid)
    if cap.n_query != n:
        raise RuntimeError(f"attention capture returned {cap.n_query} query rows, expected {n}")
    h2o = H2OAccumulator()
    h2o.add(cap.probs[:, :, :q0, :], cap.key_positions)
    snap = snapkv_key_scores(cap.probs, window=n - q0, kernel=kernel)
    return KeyScores(_fit(h2o.scores, n), _fit(snap, n), q0)


def key_scores_openvino(executor: Any, task: pt.PasskeyTask, kernel: int = 7) -> KeyScores:
    """Both score kinds from the OpenVINO executor's own scoring pass (raw per-token mass: its
    max-pooling is switched off here and applied once, for SnapKV only, as on llama.cpp)."""
    n, q0 = task.n_tokens, task.question_span[0]
    saved = executor.score_kernel
    executor.score_kernel = 1
    try:
        snap_mass = _ov_token_mass(executor, task.prompt_ids, n - q0)
        h2o_mass = _ov_token_mass(executor, task.prompt_ids[:q0], q0)
    finally:
        executor.score_kernel = saved
    return KeyScores(_fit(h2o_mass, n), _fit(_snapkv_from_mass(snap_mass, kernel), n), q0)


def _ov_token_mass(executor: Any, tokens: Sequence[int], window: int) -> np.ndarray:
    sid = "__passkey_score__"
    executor.open_session(sid)
    try:
        executor.append(sid, list(tokens))
        ranges = [Range(i, i + 1) for i in range(len(tokens))]
        return np.asarray(executor.block_attention_scores(sid, ranges, window=window), dtype=np.float64)
    finally:
        executor.close_session(sid)


def _fit(scores: np.ndarray, n: int) -> np.ndarray:
    out = np.zeros(n, dtype=np.float64)
    m = min(n, scores.shape[0])
    out[:m] = scores[:m]
    return out


# -- plans -------------------------------------------------------------------------------------
def recent_start(task: pt.PasskeyTask, cfg: EvalConfig) -> int:
    return max(cfg.sink_tokens, task.question_span[0] - cfg.recent_extra)


def prompt_blocks(n: int, recent_from: int, cfg: EvalConfig) -> list[Block]:
    """Blocks over token positions ``[0, n)``: sinks, middle in ``block_size`` pieces, recent."""
    sink = min(cfg.sink_tokens, n)
    recent_from = max(sink, min(recent_from, n))
    blocks: list[Block] = []
    if sink:
        blocks.append(Block(Range(0, sink), flags=BlockFlag.SINK))
    if recent_from > sink:
        blocks.extend(split_into_blocks([Range(sink, recent_from)], cfg.block_size))
    if n > recent_from:
        blocks.append(Block(Range(recent_from, n), flags=BlockFlag.RECENT))
    return [Block(b.range, flags=b.flags, last_used=i) for i, b in enumerate(blocks)]


def budget_tokens(task: pt.PasskeyTask, fraction: float) -> int:
    return max(1, int(round(fraction * task.n_tokens)))


def plan_for(
    task: pt.PasskeyTask,
    method: str,
    budget: int,
    scores: KeyScores | None,
    caps: Capabilities,
    cfg: EvalConfig,
) -> Plan | None:
    """The plan over the prompt minus its last token (which is re-decoded after eviction), with
    ``budget - 1`` tokens for it so that ``budget`` are resident at the first answer token."""
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    if method == "full":
        return None
    n = task.n_tokens - 1
    rs = recent_start(task, cfg)
    blocks = prompt_blocks(n, rs, cfg)
    block_score = None
    if method in SCORED:
        if scores is None:
            raise ValueError(f"method {method!r} needs key scores")
        block_score = block_scores(scores.of(method)[:n], np.arange(n), [b.range for b in blocks])
    policy = cfg.stream_policy(n - rs)
    return plan_hot_set(PlanInput(blocks, max(0, budget - 1), policy, caps, block_score))


# -- the strict answer ---------------------------------------------------------------------------
def answer_strict(
    executor: Any, task: pt.PasskeyTask, plan: Plan | None, rebase: bool = False,
    session_id: str = "__passkey__",
) -> tuple[list[int], int]:
    """Greedy answer (as many tokens as the passkey has digits) after ``plan`` was applied, with
    positions re-based (``apply_plan``) or left with gaps."""
    executor.open_session(session_id)
    try:
        executor.append(session_id, task.prompt_ids[:-1])
        if plan is not None and not plan.is_noop:
            if rebase:
                apply_plan(executor, session_id, plan)
            else:  # the same plan, positions left where they were
                for rng in reversed(plan.evict_ranges):
                    executor.evict_range(session_id, rng, rebase=False)
        logits = executor.append(session_id, task.prompt_ids[-1:])
        resident = sum(len(r) for r in executor.resident_ranges(session_id))
        out: list[int] = []
        for i in range(len(task.answer_ids)):
            out.append(int(np.argmax(logits)))
            if i + 1 < len(task.answer_ids):
                logits = executor.append(session_id, out[-1:])
        return out, resident
    finally:
        executor.close_session(session_id)


# -- runs ----------------------------------------------------------------------------------------
def evaluate(
    executor: Any,
    engine: str,
    tasks: Sequence[pt.PasskeyTask],
    methods: Iterable[str],
    budgets: Iterable[float],
    scorer: Scorer | None,
    cfg: EvalConfig | None = None,
    seed_offset: int = 0,
) -> list[Record]:
    """Every task under every method; ``full`` once per task (budget 1.0), others per budget."""
    cfg = cfg or EvalConfig()
    methods, budgets = list(methods), list(budgets)
    caps = executor.capabilities()
    records: list[Record] = []
    for i, task in enumerate(tasks):
        need_scores = any(m in SCORED for m in methods)
        scores = scorer(executor, task) if need_scores and scorer is not None else None
        full: tuple[list[int], int] | None = None  # a no-op plan answers as the full cache does
        for method in methods:
            for frac in [1.0] if method == "full" else budgets:
                budget = task.n_tokens if method == "full" else budget_tokens(task, frac)
                plan = plan_for(task, method, budget, scores, caps, cfg)
                if plan is None or plan.is_noop:
                    full = full or answer_strict(executor, task, None)
                    got, resident = full
                else:
                    got, resident = answer_strict(executor, task, plan, method in cfg.rebase)
                records.append(Record(
                    engine=engine, family=task.family, method=method, budget=float(frac),
                    budget_tokens=budget, resident_tokens=resident, depth=float(task.depth),
                    n_tokens=task.n_tokens, seed_index=seed_offset + i,
                    correct=got == task.answer_ids, answer=decode_answer(got), expected=task.answer,
                ))
    return records


def decode_answer(ids: Sequence[int]) -> str:
    """The answer as text; ids outside the task vocabulary show as ``<id>``."""
    return " ".join(pt.VOCAB[i] if 0 <= i < len(pt.VOCAB) else f"<{i}>" for i in ids)


def accuracy(records: Iterable[Record], **match: Any) -> float:
    sel = [r for r in records if all(getattr(r, k) == v for k, v in match.items())]
    if not sel:
        raise ValueError(f"no records match {match}")
    return sum(r.correct for r in sel) / len(sel)
