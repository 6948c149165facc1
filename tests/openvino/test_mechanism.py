"""The two mechanisms' bookkeeping: deferred work, blocks that move between modes, session
isolation, the compiled-model cache."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

from kvres.actors.engines.executor import apply_plan
from kvres.actors.engines.openvino import (
    MODES,
    CompiledModelCache,
    OpenVINOExecutor,
    RecomputeExecutor,
    StateExecutor,
    openvino_executor,
)
from kvres.actors.engines.openvino.states import payload_to_kv
from kvres.policy import Block, PlanInput, Range, StreamPolicy, plan_hot_set, split_into_blocks

PROMPT = [1] + [3 + (i * 29) % 450 for i in range(299)]


class _CountingExecutor(RecomputeExecutor):
    calls = 0

    def _run(self, s, tokens: Sequence[int], positions: Sequence[int], past: int):  # type: ignore[no-untyped-def]
        self.calls += 1
        return super()._run(s, tokens, positions, past)


def _streaming_plan(ex: OpenVINOExecutor):  # type: ignore[no-untyped-def]
    blocks = [Block(b.range, last_used=i) for i, b in enumerate(split_into_blocks(ex.resident_ranges("s"), 16))]
    return plan_hot_set(PlanInput(blocks, 96, StreamPolicy(True, 4, 48), ex.capabilities()))


def test_modes_build_their_mechanism(stories_gguf: Path) -> None:
    assert set(MODES) == {"state", "recompute"}
    assert type(openvino_executor(stories_gguf)) is StateExecutor
    rec = openvino_executor(stories_gguf, mode="recompute", num_threads=1, score_window=8)
    assert type(rec) is RecomputeExecutor and rec.mode == "recompute" and rec.score_window == 8
    with pytest.raises(ValueError, match="'state', 'recompute'.*'slice'"):
        openvino_executor(stories_gguf, mode="slice")


def test_a_plan_costs_one_re_prefill_in_recompute_mode(stories_gguf: Path) -> None:
    ex = _CountingExecutor(stories_gguf)
    ex.open_session("s")
    ex.append("s", PROMPT)
    plan = _streaming_plan(ex)
    assert len(plan.evict_cold) > 5
    before = ex.calls
    apply_plan(ex, "s", plan)
    assert ex.calls == before
    ex.append("s", [5])
    assert ex.calls == before + 2  # one re-prefill of the survivors, one decode


def test_blocks_exported_by_recompute_mode_equal_state_mode_exports(stories_gguf: Path) -> None:
    """Blocks exported while a re-base is pending carry keys rotated to their new positions."""
    rec, state = RecomputeExecutor(stories_gguf), StateExecutor(stories_gguf)
    early = {}
    for e in (rec, state):
        e.open_session("s")
        e.append("s", PROMPT)
        e.evict_range("s", Range(200, 232), rebase=True)
        early[e.mode] = e.export_range("s", Range(16, 48))
        e.evict_range("s", Range(16, 48), rebase=True)
    a, b = rec.export_range("s", Range(100, 120)), state.export_range("s", Range(100, 120))
    assert a.positions == b.positions == tuple(range(68, 88)) and a.fingerprint == b.fingerprint
    for (ka, va), (kb, vb) in zip(payload_to_kv(a.payload, a.geometry, 20),
                                  payload_to_kv(b.payload, b.geometry, 20), strict=True):
        np.testing.assert_allclose(ka, kb, atol=1e-5)
        np.testing.assert_array_equal(va, vb)
    # and a recompute-mode block imports into a state-mode session of the same model
    fresh = StateExecutor(stories_gguf)
    fresh.open_session("s", PROMPT)
    fresh.import_range("s", early["recompute"])
    assert fresh.resident_ranges("s") == [Range(16, 48)]


def test_state_mode_plan_equals_one_block_at_a_time(stories_gguf: Path) -> None:
    """Deferring a plan's slices into one sync gives the logits of syncing after every block."""
    one, each = StateExecutor(stories_gguf), StateExecutor(stories_gguf)
    for e in (one, each):
        e.open_session("s")
        e.append("s", PROMPT)
    plan = _streaming_plan(one)
    apply_plan(one, "s", plan)
    for rng in reversed(plan.evict_ranges):
        each.evict_range("s", rng, rebase=True)
        each.sync("s")
    assert one.resident_ranges("s") == each.resident_ranges("s")
    np.testing.assert_allclose(one.append("s", [5]), each.append("s", [5]), atol=1e-4)


def test_closing_one_session_leaves_the_other(stories_gguf: Path) -> None:
    ex = StateExecutor(stories_gguf)
    solo = StateExecutor(stories_gguf)
    for sid in ("a", "b"):
        ex.open_session(sid)
        ex.append(sid, PROMPT[:50])
    solo.open_session("a")
    solo.append("a", PROMPT[:50])
    ex.evict_range("b", Range(0, 20), rebase=True)
    ex.close_session("b")
    assert ex.sessions() == ["a"]
    np.testing.assert_array_equal(ex.append("a", [5]), solo.append("a", [5]))


def test_kv_profile_comes_from_the_states(stories_gguf: Path) -> None:
    from kvres.actors.model_files import profile_from_gguf

    profile = StateExecutor(stories_gguf).kv_profile()
    assert (profile.global_layers, profile.windowed_layers) == (5, 0)
    assert profile.per_layer_kv_bytes == 2 * 4 * 8 * 4  # K+V, 4 kv heads x 8 dims, f32
    assert profile.kv_bytes_for_context(100) == profile_from_gguf(stories_gguf, "f32", "f32").kv_bytes_for_context(100)


def test_kv_profile_of_the_plugins_own_kv_precision(stories_gguf: Path) -> None:
    ex = StateExecutor(stories_gguf, precision="default")
    bits = {"f32": 32, "f16": 16, "bf16": 16, "u8": 8, "i8": 8, "u4": 4}[ex.kv_type]
    assert ex.kv_profile().per_layer_kv_bytes == 2 * 4 * 8 * bits / 8


def test_compiled_cache_keeps_the_most_recent_models(stories_gguf: Path, other_gguf: Path) -> None:
    cache = CompiledModelCache(max_entries=2)

    def compiled(path: Path, threads: int = 1) -> object:
        return cache.get(path, "CPU", "f32", threads)[1]

    stories, other = compiled(stories_gguf), compiled(other_gguf)
    assert compiled(stories_gguf) is stories and len(cache) == 2
    compiled(stories_gguf, threads=2)  # a third entry: the least recently used one goes
    assert len(cache) == 2
    assert compiled(stories_gguf) is stories
    assert compiled(other_gguf) is not other
    with pytest.raises(ValueError, match="max_entries"):
        CompiledModelCache(max_entries=0)


def test_executors_compile_through_the_cache_they_are_given(stories_gguf: Path) -> None:
    cache = CompiledModelCache(max_entries=1)
    a = StateExecutor(stories_gguf, compiled_cache=cache)
    b = RecomputeExecutor(stories_gguf, compiled_cache=cache)
    assert len(cache) == 1
    loaded, compiled = cache.get(stories_gguf, "CPU", "f32", 1)
    assert a.loaded is b.loaded is loaded
    assert a._compiled is b._compiled is compiled
    assert StateExecutor(stories_gguf).loaded is not loaded  # the shared cache is another one
