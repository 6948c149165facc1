"""Retrieval under eviction with the project's own passkey model (docs/policies.md, T2: H2O and
SnapKV; docs/architecture.md, How correctness is judged).

STRICT protocol (``benchmarks.passkey.harness.answer_strict``): the plan is applied to the prompt
minus its last token, which is then decoded against the evicted cache, so the first answer digit
comes from what the policy kept. Blocks of 4 tokens, 4 sink tokens, recent window = the question
+ 2 tokens (protected for every method), through ``plan_hot_set`` (streaming re-based by
``apply_plan``; H2O / SnapKV keep position gaps). Fixed prompt sets (``fixed_task_set``, seed 0,
needle in the middle third):

- family 1 (one passkey), 50 prompts of 300-394 tokens, budget 10% of the prompt on llama.cpp:
  SnapKV (question window) >= 90%, streaming (sinks + recent) <= 10%.
- family 2 (4 key/value needles, the question asks for one), 50 prompts of 300-394 tokens, budget
  25%: SnapKV (>= 90%) beats H2O accumulated over the prompt before the question by at least 0.5
  (measured: +0.98, see ``MULTI_MARGIN``).
- the model on OpenVINO (state-mode executor, converted from the GGUF), full cache, both sets:
  >= 95%.

A missing ``models/passkey.gguf`` fails (never skips), naming the path.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.passkey import harness as h
from models import passkey_tasks as pt

GGUF = Path(__file__).resolve().parents[2] / "models" / "passkey.gguf"
N_PROMPTS = 50
LENGTHS = (300, 394)
MIDDLE_THIRD = (1 / 3, 2 / 3)
CFG = h.EvalConfig()  # blocks of 4, sinks 4, recent = question + 2, SnapKV max-pool kernel 7

# Measured (llama.cpp, 1 thread; OpenVINO gave the same answers) on passkey.gguf sha256 9c8cb684...
# (train_passkey.py run of 2026-11-29 19:42, family 2 learned):
#   family 1 at 10%: full cache 100%, SnapKV 100%, streaming 0%, H2O 0%;
#   family 2 at 25%: full cache 98%, SnapKV 98%, H2O 0%, streaming 0%: margin +0.98.
# (The earlier b0db4077... model never learned family 2, 0% with a full cache; on family 1 it
# gave SnapKV 96% at 10%.) Asserted: a SnapKV floor of 90% (measured 98%) and about half the
# measured margin. Slack, because the answers are deterministic for one model on one CPU, but other
# CPUs' float rounding (f16 KV, SIMD paths) flips borderline prompts, and a retrain is only
# required to reproduce full-cache accuracy within 2 points, not every eviction result. +0.5
# still means SnapKV answers 25 more of the 50 prompts than H2O: the effect this test shows.
MULTI_MARGIN = 0.5
MULTI_SNAPKV_FLOOR = 0.9


@pytest.fixture(scope="module")
def gguf() -> Path:
    if not GGUF.is_file():
        pytest.fail(f"passkey model missing: {GGUF} (train it: python models/train_passkey.py)", pytrace=False)
    return GGUF


@pytest.fixture(scope="module")
def llama(gguf: Path):
    from kvres.actors.llama import LlamaExecutor

    ex = LlamaExecutor(gguf, n_ctx=1024, n_seq_max=2, n_threads=1)
    yield ex
    ex.close()


def _tasks(family: int) -> list[pt.PasskeyTask]:
    return pt.fixed_task_set(family, N_PROMPTS, seed=0, n_tokens=LENGTHS, depth=MIDDLE_THIRD)


@pytest.fixture(scope="module")
def single_records(llama) -> list[h.Record]:
    return h.evaluate(llama, "llama.cpp", _tasks(1), ("full", "streaming", "snapkv"), (0.10,),
                      h.key_scores_llama, CFG)


@pytest.fixture(scope="module")
def multi_records(llama) -> list[h.Record]:
    return h.evaluate(llama, "llama.cpp", _tasks(2), ("full", "h2o", "snapkv"), (0.25,),
                      h.key_scores_llama, CFG)


def _acc(records: list[h.Record], method: str) -> float:
    return h.accuracy(records, method=method)


def test_fixed_sets_are_what_the_thresholds_were_measured_on() -> None:
    for family in (1, 2):
        tasks = _tasks(family)
        assert len(tasks) == N_PROMPTS >= 50
        for t in tasks:
            assert LENGTHS[0] <= t.n_tokens <= LENGTHS[1]
            assert MIDDLE_THIRD[0] <= t.depth <= MIDDLE_THIRD[1]


def test_snapkv_keeps_the_passkey_at_10_percent_where_streaming_loses_it(single_records) -> None:
    full, snap, stream = (_acc(single_records, m) for m in ("full", "snapkv", "streaming"))
    over = [r for r in single_records if r.method != "full" and r.resident_tokens > r.budget_tokens]
    assert not over, f"{len(over)} answers had more resident tokens than 10% of their prompt"
    assert snap >= 0.90, f"SnapKV at 10%: {snap:.0%} < 90% (full cache {full:.0%}, streaming {stream:.0%})"
    assert stream <= 0.10, f"streaming at 10%: {stream:.0%} > 10% (needles sit in the middle third)"


def test_question_window_beats_h2o_before_the_question_on_several_needles(multi_records) -> None:
    full, snap, h2o = (_acc(multi_records, m) for m in ("full", "snapkv", "h2o"))
    assert full >= 0.95, (
        f"the model answers {full:.0%} of the family-2 prompts with a full cache (< 95%): the margin of "
        f"SnapKV ({snap:.0%}) over H2O ({h2o:.0%}) at 25% cannot be measured on it"
    )
    assert snap >= MULTI_SNAPKV_FLOOR, f"SnapKV at 25% on family 2: {snap:.0%} < {MULTI_SNAPKV_FLOOR:.0%}"
    assert snap - h2o >= MULTI_MARGIN, (
        f"SnapKV {snap:.0%} - H2O {h2o:.0%} = {snap - h2o:+.0%} < {MULTI_MARGIN:.0%} at a 25% budget "
        f"(full cache {full:.0%})"
    )


@pytest.mark.parametrize("family", [1, 2])
def test_openvino_answers_with_a_full_cache(gguf: Path, family: int) -> None:
    from kvres.actors.openvino import openvino_executor

    ex = openvino_executor(gguf, mode="state", num_threads=1)
    records = h.evaluate(ex, "openvino", _tasks(family), ("full",), (), None, CFG)
    acc = _acc(records, "full")
    assert acc >= 0.95, f"OpenVINO full-cache accuracy {acc:.0%} < 95% on {N_PROMPTS} family-{family} prompts"
