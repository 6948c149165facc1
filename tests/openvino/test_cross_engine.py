"""Cross-engine: the same plan applied on llama.cpp and on OpenVINO gives the same next tokens.

Stated tolerance (f32 on both engines): max |logit difference| <= LOGIT_ATOL = 1e-4 and
KL(llama || openvino) <= KL_MAX = 1e-6 nats on the next-token distribution, argmax equal, for:
- state mode (slice + numpy RoPE rotation) vs llama's native ``seq_rm`` + ``seq_add`` K-shift,
- recompute mode (re-prefill of the survivors) vs llama re-prefilling the same survivors (re-based
  plans only: llama.cpp refuses a batch whose positions have gaps, so it cannot re-prefill a gap),
- state-mode admission vs llama decoding the admitted range into its sequence.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from benchmarks.openvino_mechanism.llama_native import LlamaNative, NativeSession
from kvres.actors.engines.executor import apply_plan
from kvres.actors.engines.openvino import OpenVINOExecutor, StateExecutor, openvino_executor
from kvres.policy import Block, PlanInput, Range, StreamPolicy, plan_hot_set, split_into_blocks
from kvres.testing import kl_divergence

LOGIT_ATOL = 1e-4
KL_MAX = 1e-6
PROMPT = [1] + [3 + (i * 37 + (i * i) % 13) % 490 for i in range(239)]


def assert_same_distribution(ov_logits: np.ndarray, llama_logits: np.ndarray) -> None:
    assert ov_logits.argmax() == llama_logits.argmax()
    assert np.abs(ov_logits - llama_logits).max() <= LOGIT_ATOL
    assert kl_divergence(llama_logits, ov_logits) <= KL_MAX


PLANS = {
    "streaming-rebase": (64, StreamPolicy(True, sink_tokens=4, recent_tokens=32), None),
    "recency-gap": (100, StreamPolicy(), None),
    "scored-gap": (96, StreamPolicy(), [1.0 if i in (3, 7, 9) else 0.1 for i in range(15)]),
}


def _plan(executor: OpenVINOExecutor, budget: int, stream: StreamPolicy, scores: list[float] | None):
    blocks = [Block(b.range, last_used=i) for i, b in
              enumerate(split_into_blocks(executor.resident_ranges("s"), 16))]
    return plan_hot_set(PlanInput(blocks, budget, stream, executor.capabilities(), scores))


# recompute mode is compared on re-based plans only: llama.cpp cannot re-prefill at gapped positions
CASES = [("state", name) for name in sorted(PLANS)] + [("recompute", "streaming-rebase")]


@pytest.mark.parametrize(("mode", "plan_name"), CASES, ids=[f"{m}-{p}" for m, p in CASES])
def test_same_plan_same_next_token_distribution(
    stories_gguf: Path, llama: LlamaNative, mode: str, plan_name: str
) -> None:
    executor = openvino_executor(stories_gguf, mode=mode)
    executor.open_session("s")
    executor.append("s", PROMPT)
    native = NativeSession(llama)
    native.append(PROMPT)
    plan = _plan(executor, *PLANS[plan_name])
    assert plan.evict_cold, "the plan must evict something"
    evicted = apply_plan(executor, "s", plan)
    for rng in reversed(evicted):
        native.evict_range(rng, rebase=plan.rebase_positions)
    if mode == "recompute":
        native.rebuild()
    assert native.positions.resident_ranges() == executor.resident_ranges("s")
    np.testing.assert_array_equal(native.positions.all_positions(), executor.cache_positions("s"))
    for step in range(5):  # the next token, then a few greedy steps on the evicted cache
        got, want = executor.append("s", [7 + step]), native.append([7 + step])
        assert_same_distribution(got, want)


def test_admit_after_eviction_matches_llama(stories_gguf: Path, llama: LlamaNative) -> None:
    executor = StateExecutor(stories_gguf)
    executor.open_session("s")
    executor.append("s", PROMPT)
    native = NativeSession(llama)
    native.append(PROMPT)
    for ex_op, nat_op in [
        (lambda: executor.evict_range("s", Range(20, 120), rebase=True),
         lambda: native.evict_range(Range(20, 120), rebase=True)),
        (lambda: executor.admit_range("s", Range(20, 60)), lambda: native.admit_range(Range(20, 60))),
        (lambda: executor.admit_range("s", Range(60, 90)), lambda: native.admit_range(Range(60, 90))),
    ]:
        ex_op()
        nat_op()
        np.testing.assert_array_equal(native.positions.all_positions(), executor.cache_positions("s"))
    assert_same_distribution(executor.append("s", [9]), native.append([9]))


@pytest.mark.parametrize("plan_name", sorted(PLANS))
def test_project_llama_executor_agrees_with_state_mode(stories_gguf: Path, plan_name: str) -> None:
    """The same plan through ``apply_plan`` on the project's two executors, then an admission."""
    from kvres.actors.engines.llama import LlamaExecutor

    ov_ex = StateExecutor(stories_gguf)
    llama_ex = LlamaExecutor(stories_gguf, n_ctx=1024, type_k="f32", type_v="f32", flash_attn=False,
                             n_threads=1)
    try:
        for e in (ov_ex, llama_ex):
            e.open_session("s")
            e.append("s", PROMPT)
        plan = _plan(ov_ex, *PLANS[plan_name])
        for e in (ov_ex, llama_ex):
            apply_plan(e, "s", plan)
        assert llama_ex.resident_ranges("s") == ov_ex.resident_ranges("s")
        np.testing.assert_array_equal(llama_ex.cache_positions("s"), ov_ex.cache_positions("s"))
        assert_same_distribution(ov_ex.append("s", [7]), llama_ex.append("s", [7]))
        first = plan.evict_ranges[0]
        for e in (ov_ex, llama_ex):
            e.admit_range("s", first)
        np.testing.assert_array_equal(llama_ex.cache_positions("s"), ov_ex.cache_positions("s"))
        assert_same_distribution(ov_ex.append("s", [8]), llama_ex.append("s", [8]))
    finally:
        llama_ex.close()
