"""Bad input gets typed errors that name the value; a failed recompute leaves the session intact."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np
import openvino as ov
import openvino.opset13 as ops
import pytest

from kvres.actors.engines.executor import apply_plan
from kvres.actors.engines.openvino import (
    MODES,
    OpenVINOExecutor,
    RecomputeError,
    RecomputeExecutor,
    StateExecutor,
    load_model,
)
from kvres.policy import (
    Block,
    BlockMismatchError,
    ModelLoadError,
    PlanInput,
    Range,
    StreamPolicy,
    plan_hot_set,
    split_into_blocks,
)
from kvres.testing import ReferenceExecutor

from .conftest import write_tiny_llama_gguf

PROMPT = [1] + [3 + (i * 11) % 400 for i in range(149)]


def test_missing_file_is_named(tmp_path: Path) -> None:
    missing = tmp_path / "nope.gguf"
    with pytest.raises(ModelLoadError, match="nope.gguf"):
        StateExecutor(missing)


def test_neither_gguf_nor_ir_is_named(tmp_path: Path) -> None:
    junk = tmp_path / "weights.bin"
    junk.write_bytes(b"\x00\x01not a model at all")
    with pytest.raises(ModelLoadError, match="weights.bin.*neither a GGUF"):
        load_model(junk)
    fake_xml = tmp_path / "fake.xml"
    fake_xml.write_text("<?xml version='1.0'?><net><broken")
    with pytest.raises(ModelLoadError, match="fake.xml"):
        load_model(fake_xml)


def test_gguf_of_another_architecture_is_refused(tmp_path: Path) -> None:
    path = write_tiny_llama_gguf(tmp_path / "gpt2ish.gguf", arch="gpt2")
    with pytest.raises(ModelLoadError, match="gpt2ish.gguf.*'gpt2'"):
        load_model(path)


def test_ir_without_kv_states_is_refused(tmp_path: Path) -> None:
    params = [ops.parameter([-1, -1], ov.Type.i64, name=n)
              for n in ("input_ids", "attention_mask", "position_ids")]
    params.append(ops.parameter([-1], ov.Type.i32, name="beam_idx"))
    for p in params:
        p.output(0).get_tensor().set_names({p.get_friendly_name()})
    logits = ops.convert(ops.add(params[0], params[2]), ov.Type.f32)
    xml = tmp_path / "stateless.xml"
    ov.save_model(ov.Model([ops.result(logits)], params, "stateless"), str(xml))
    with pytest.raises(ModelLoadError, match="stateless.xml.*no KV states"):
        StateExecutor(xml)


def test_block_from_another_model_is_refused(stories_gguf: Path, other_gguf: Path) -> None:
    ours = StateExecutor(stories_gguf)
    other = StateExecutor(other_gguf)
    ours.open_session("s")
    other.open_session("s")
    ours.append("s", list(range(3, 40)))
    other.append("s", list(range(3, 40)))
    foreign = other.export_range("s", Range(10, 20))
    ours.evict_range("s", Range(10, 20))
    with pytest.raises(BlockMismatchError, match=foreign.fingerprint):
        ours.import_range("s", foreign)
    assert ours.resident_ranges("s") == [Range(0, 10), Range(20, 37)]
    reference = ReferenceExecutor()
    reference.open_session("s")
    reference.append("s", list(range(3, 40)))
    with pytest.raises(BlockMismatchError, match="reference"):
        ours.import_range("s", reference.export_range("s", Range(10, 20)))


def test_block_of_other_tokens_or_other_precision_is_refused(stories_gguf: Path) -> None:
    ex = StateExecutor(stories_gguf)
    ex.open_session("s")
    ex.append("s", PROMPT)
    block = ex.export_range("s", Range(30, 40))
    ex.evict_range("s", Range(30, 40))
    forged = replace(block, token_ids=tuple(t + 1 for t in block.token_ids))
    with pytest.raises(BlockMismatchError, match="other token ids"):
        ex.import_range("s", forged)
    low = StateExecutor(stories_gguf, precision="default")
    assert low.kv_type != ex.kv_type and low.fingerprint != ex.fingerprint
    low.open_session("s", ex.token_log("s"))
    with pytest.raises(BlockMismatchError, match=f"KV {ex.kv_type}"):
        low.import_range("s", block)


def test_bad_token_id_is_named(stories_gguf: Path) -> None:
    ex = StateExecutor(stories_gguf)
    ex.open_session("s")
    with pytest.raises(ValueError, match=r"token ids\[2\] = 512 is outside the vocabulary \[0, 512\)"):
        ex.append("s", [1, 2, 512])
    assert ex.token_log("s") == []


def test_recompute_mode_rebuilds_any_residency(stories_gguf: Path) -> None:
    """Without a cold store the token log is enough: a streaming plan with re-basing runs in full,
    and the next token sees the survivors exactly as a session that was only ever given them."""
    ex = RecomputeExecutor(stories_gguf)
    caps = ex.capabilities()
    assert caps.remove_middle and caps.position_shift and caps.kv_export
    ex.open_session("s")
    ex.append("s", PROMPT)
    blocks = [Block(b.range, last_used=i) for i, b in enumerate(split_into_blocks(ex.resident_ranges("s"), 16))]
    plan = plan_hot_set(PlanInput(blocks, 64, StreamPolicy(True, 4, 32), caps))
    assert not plan.is_noop and plan.rebase_positions and not plan.diagnostics
    apply_plan(ex, "s", plan)
    survivors = [t for r in ex.resident_ranges("s") for t in PROMPT[r.start:r.end]]
    assert len(survivors) <= 64
    np.testing.assert_array_equal(ex.cache_positions("s")[ex.cache_positions("s") >= 0],
                                  np.arange(len(survivors)))
    only = RecomputeExecutor(stories_gguf)
    only.open_session("s")
    only.append("s", survivors)
    np.testing.assert_allclose(ex.append("s", [5]), only.append("s", [5]), atol=1e-5)


def test_recompute_mode_drops_evicted_ranges_and_brings_them_back(stories_gguf: Path) -> None:
    """Evicting keeps no copy; admitting recomputes from the token log and importing checks the
    block, then re-prefills: both give back the uninterrupted session."""
    expected = RecomputeExecutor(stories_gguf)
    expected.open_session("s")
    expected.append("s", PROMPT)
    want = expected.append("s", [5])
    for bring_back in ("admit", "import"):
        ex = RecomputeExecutor(stories_gguf)
        ex.open_session("s")
        ex.append("s", PROMPT)
        block = ex.export_range("s", Range(32, 64))
        ex.evict_range("s", Range(32, 64), rebase=True)
        assert ex.resident_ranges("s") == [Range(0, 32), Range(64, 150)]
        if bring_back == "admit":
            ex.admit_range("s", Range(32, 64))
        else:
            forged = replace(block, token_ids=tuple(t + 1 for t in block.token_ids))
            with pytest.raises(BlockMismatchError, match="other token ids"):
                ex.import_range("s", forged)
            ex.import_range("s", block)
        assert ex.resident_ranges("s") == [Range(0, 150)]
        np.testing.assert_array_equal(ex.cache_positions("s"), np.arange(150))
        np.testing.assert_allclose(ex.append("s", [5]), want, atol=1e-5)


class _Failing:
    """Mixed into a real executor: its engine call fails on demand (the only way to make infer fail)."""

    fail = False

    def _run(self, s, tokens: Sequence[int], positions: Sequence[int], past: int):  # type: ignore[no-untyped-def]
        if self.fail:
            raise RuntimeError("injected engine failure")
        return super()._run(s, tokens, positions, past)  # type: ignore[misc]


class _FailingState(_Failing, StateExecutor):
    pass


class _FailingRecompute(_Failing, RecomputeExecutor):
    pass


def _twins(stories_gguf: Path, mode: str) -> tuple[_Failing, OpenVINOExecutor]:
    failing = {"state": _FailingState, "recompute": _FailingRecompute}[mode]
    ex = failing(stories_gguf)
    control = MODES[mode](stories_gguf)
    for e in (ex, control):
        e.open_session("s")
        e.append("s", PROMPT)
        e.evict_range("s", Range(100, 120))
    return ex, control


@pytest.mark.parametrize("operation", ["evict", "admit"])
def test_failed_recompute_leaves_token_log_intact(stories_gguf: Path, operation: str) -> None:
    """Recompute mode re-prefills at the next sync (here: append); when that fails, the token log,
    the residency the plan asked for and the held KV survive, and a later sync succeeds."""
    ex, control = _twins(stories_gguf, "recompute")
    for e in (ex, control):
        if operation == "evict":
            e.evict_range("s", Range(20, 40), rebase=True)
        else:
            e.admit_range("s", Range(100, 120))
    log, ranges = ex.token_log("s"), ex.resident_ranges("s")
    ex.fail = True
    with pytest.raises(RecomputeError, match="'s'.*injected engine failure"):
        ex.append("s", [5])
    assert ex.token_log("s") == log and ex.resident_ranges("s") == ranges
    with pytest.raises(RecomputeError):
        ex.sync("s")
    ex.fail = False
    np.testing.assert_array_equal(ex.append("s", [5]), control.append("s", [5]))


def test_failed_state_admission_changes_nothing(stories_gguf: Path) -> None:
    """State-mode eviction makes no engine call (slice + rotate); admission does."""
    ex, control = _twins(stories_gguf, "state")
    log, ranges = ex.token_log("s"), ex.resident_ranges("s")
    ex.fail = True
    with pytest.raises(RecomputeError, match="'s'.*injected engine failure"):
        ex.admit_range("s", Range(100, 120))
    ex.fail = False
    assert ex.token_log("s") == log and ex.resident_ranges("s") == ranges
    np.testing.assert_array_equal(ex.append("s", [5]), control.append("s", [5]))
