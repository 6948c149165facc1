"""OpenVINO's own eviction (genai ``CacheEvictionConfig``) next to kvres's, on one long prompt.

Primitives:
- ``compare_engine_eviction(model, genai_dir, prompt_len, new_tokens, policy, budget) -> dict``:
  greedy continuations of the same prompt by
  - ``genai_full``: continuous batching, no eviction (the reference continuation),
  - ``genai_sum`` / ``genai_norm_sum``: continuous batching with ``CacheEvictionConfig`` built by
    ``EngineEviction.from_stream_policy`` (SUM / NORM_SUM aggregation of attention scores),
  - ``kvres_state``: ``openvino_executor(mode="state")``, the planner's StreamingLLM plan applied
    after the prefill and again whenever the cache outgrows the budget by a block,
  - ``kvres_state_scored``: the same with per-block attention scores from the executor's scoring
    pass (``attention`` through the ``SnapKV`` scorer object), so the middle keeps its most-attended blocks (like genai),
  - ``kvres_state_scored_gap``: the same plan with positions left as they were (no re-base), which
    is what genai does with ``apply_rotation=False`` (its default),
  each with its wall time per generated token and how many leading tokens agree with the reference.
The engine rounds its windows up to whole 32-token KV blocks, so kvres is given the same rounded
sink / recent / budget sizes. A tiny model does not need its middle, so agreement measures how much
each method perturbs the continuation, not retrieval quality.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np

from kvres.actors.engines.executor import apply_plan
from kvres.policy import Block, PlanInput, StreamPolicy, plan_hot_set, split_into_blocks
from kvres.policy.scorers import SnapKV

BLOCK = 16


def _agree(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def _kvres_generate(model: Path, prompt: list[int], new_tokens: int, policy: StreamPolicy,
                    budget: int, scored: bool, rebase: bool) -> list[int]:
    from kvres.actors.engines.openvino import openvino_executor

    ex = openvino_executor(model, mode="state")
    ex.open_session("s")
    logits = ex.append("s", prompt)
    out: list[int] = []

    def shrink() -> None:
        blocks = [Block(b.range, last_used=i)
                  for i, b in enumerate(split_into_blocks(ex.resident_ranges("s"), BLOCK))]
        scores = SnapKV(16).block_scores(ex.attention("s", 16), [b.range for b in blocks]) if scored else None
        plan = plan_hot_set(PlanInput(blocks, budget, policy, ex.capabilities(), scores))
        if rebase:
            apply_plan(ex, "s", plan)
        else:  # keep the gaps, as genai does without apply_rotation
            for rng in reversed(plan.evict_ranges):
                ex.evict_range("s", rng, rebase=False)

    shrink()
    for _ in range(new_tokens):
        out.append(int(logits.argmax()))
        logits = ex.append("s", [out[-1]])
        if sum(len(r) for r in ex.resident_ranges("s")) >= budget + BLOCK:
            shrink()
    return out


def compare_engine_eviction(model: Path, genai_dir: Path, prompt_len: int = 400, new_tokens: int = 32,
                            policy: StreamPolicy | None = None, budget: int = 128) -> dict[str, Any]:
    from kvres.actors.engines.openvino.genai import EngineEviction, GenAIEngine

    policy = policy or StreamPolicy(True, sink_tokens=4, recent_tokens=64)
    rng = np.random.default_rng(prompt_len)
    prompt = [1] + rng.integers(3, 500, prompt_len - 1).tolist()
    runs: dict[str, tuple[list[int], float]] = {}
    engines: dict[str, EngineEviction | None] = {
        "genai_full": None,
        "genai_sum": EngineEviction.from_stream_policy(policy, budget, "SUM"),
        "genai_norm_sum": EngineEviction.from_stream_policy(policy, budget, "NORM_SUM"),
    }
    for name, eviction in engines.items():
        engine = GenAIEngine(genai_dir, eviction=eviction)
        engine.generate([prompt[:8]], 1)  # warm-up
        t0 = time.perf_counter()
        tokens = engine.generate([prompt], new_tokens)[0]
        runs[name] = (tokens, time.perf_counter() - t0)
    ev = engines["genai_norm_sum"]
    assert ev is not None
    same = StreamPolicy(True, sink_tokens=ev.start_size, recent_tokens=ev.recent_size)
    for name, scored, rebase in (("kvres_state", False, True), ("kvres_state_scored", True, True),
                                 ("kvres_state_scored_gap", True, False)):
        t0 = time.perf_counter()
        tokens = _kvres_generate(model, prompt, new_tokens, same, ev.max_cache_size, scored, rebase)
        runs[name] = (tokens, time.perf_counter() - t0)
    reference = runs["genai_full"][0]
    return {
        "prompt_tokens": prompt_len, "new_tokens": new_tokens,
        "sink_tokens": ev.start_size, "recent_tokens": ev.recent_size, "budget_tokens": ev.max_cache_size,
        "methods": {
            name: {"ms_per_token_incl_prefill": 1e3 * secs / new_tokens,
                   "agree_with_full_cache": _agree(toks, reference), "tokens": toks}
            for name, (toks, secs) in runs.items()
        },
    }
