"""KV precision (f16 / q8_0 / q4_0), flash attention choice, and the model's KV profile."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from kvres.actors.engines.llama import LlamaExecutor
from kvres.policy import CapabilityError, Range
from kvres.policy.capacity import LayerKVProfile

TOKENS = [(7 * i + 3) % 60 + 259 for i in range(120)]  # word tokens of the random model


@pytest.mark.parametrize(("type_k", "type_v"), [("f16", "f16"), ("q8_0", "q8_0"), ("q4_0", "q4_0"),
                                                ("q8_0", "f16")])
def test_quantized_caches_round_trip_exactly(
    make_llama: Callable[..., LlamaExecutor], quant_model: Path, type_k: str, type_v: str
) -> None:
    executor = make_llama(model=quant_model, type_k=type_k, type_v=type_v)
    assert executor.flash_attn  # default, and required by a quantized V cache
    executor.open_session("s")
    executor.append("s", TOKENS[:100])
    reference = make_llama(model=quant_model, type_k=type_k, type_v=type_v)
    reference.open_session("s")
    reference.append("s", TOKENS[:100])
    expected = reference.append("s", TOKENS[100:101])
    block = executor.export_range("s", Range(30, 70))
    assert (block.type_k, block.type_v) == (type_k, type_v)
    executor.evict_range("s", Range(30, 70))
    executor.import_range("s", block)
    assert np.max(np.abs(executor.append("s", TOKENS[100:101]) - expected)) == 0.0


def test_quantized_cache_stays_close_to_f16(make_llama: Callable[..., LlamaExecutor], quant_model: Path) -> None:
    results = {}
    for kv in ("f16", "q8_0", "q4_0"):
        executor = make_llama(model=quant_model, type_k=kv, type_v=kv)
        executor.open_session("s")
        results[kv] = executor.append("s", TOKENS)
    assert np.max(np.abs(results["q8_0"] - results["f16"])) < np.max(np.abs(results["q4_0"] - results["f16"]))
    assert int(np.argmax(results["q8_0"])) == int(np.argmax(results["f16"]))


def test_a_quantized_k_cache_cannot_shift(make_llama: Callable[..., LlamaExecutor], quant_model: Path) -> None:
    """llama.cpp 0.3.36 segfaults applying a K-shift to a q8_0 / q4_0 K cache, so the executor
    advertises no position_shift and refuses every operation that would move cells."""
    executor = make_llama(model=quant_model, type_k="q8_0", type_v="q8_0")
    assert not executor.capabilities().position_shift
    executor.open_session("s")
    executor.append("s", TOKENS[:100])
    block = executor.export_range("s", Range(40, 60))
    with pytest.raises(CapabilityError, match="position_shift"):
        executor.evict_range("s", Range(0, 20), rebase=True)
    executor.evict_range("s", Range(40, 60))
    executor.evict_range("s", Range(90, 100))
    before = executor.resident_ranges("s"), executor.cache_positions("s").tolist()
    with pytest.raises(CapabilityError, match="K-shift"):
        executor.append("s", [300])  # after the evicted tail's gap
    with pytest.raises(CapabilityError, match="K-shift"):
        executor.admit_range("s", Range(95, 100))  # after a gap
    assert (executor.resident_ranges("s"), executor.cache_positions("s").tolist()) == before
    executor.import_range("s", block)  # back at its own positions: no shift needed
    executor.admit_range("s", Range(90, 100))
    assert np.all(np.isfinite(executor.append("s", [300])))


def test_a_quantized_k_cache_keeps_gaps_without_shifting(
    make_llama: Callable[..., LlamaExecutor], quant_model: Path
) -> None:
    """What a rebase=False session does on a q8_0 K cache: middle ranges evicted without
    re-basing, turns appended (batched with another session) after the gaps, past n_ctx. The next
    token goes at the sequence's last position + 1, so no cell moves; the logits follow f16's."""
    tokens = [(7 * i + 3) % 60 + 259 for i in range(300)]
    logits = {}
    for kv in ("f16", "q8_0"):
        executor = make_llama(model=quant_model, n_ctx=160, type_k=kv, type_v=kv)
        executor.open_session("s")
        executor.open_session("other")
        executor.append("s", tokens[:100])
        logits[kv] = []
        for turn in range(8):
            n = 100 + 20 * turn
            executor.evict_range("s", Range(n - 40, n - 20), rebase=False)
            out = executor.append_many([("s", tokens[n : n + 20]), ("other", tokens[turn : turn + 4])])
            logits[kv].append(out[0])
        resident = np.flatnonzero(executor.cache_positions("s") >= 0)
        assert executor.cache_positions("s")[resident].tolist() == resident.tolist()  # never shifted
        assert resident[-1] == 259 > executor.n_ctx
    for f16, q8 in zip(logits["f16"], logits["q8_0"], strict=True):
        assert int(np.argmax(q8)) == int(np.argmax(f16)) and np.max(np.abs(q8 - f16)) < 0.2


def test_a_quantized_v_cache_still_shifts(make_llama: Callable[..., LlamaExecutor], quant_model: Path) -> None:
    gap = make_llama(model=quant_model, type_k="f16", type_v="q8_0")
    rebased = make_llama(model=quant_model, type_k="f16", type_v="q8_0")
    for executor, rebase in ((gap, False), (rebased, True)):
        assert executor.capabilities().position_shift
        executor.open_session("s")
        executor.append("s", TOKENS[:100])
        executor.evict_range("s", Range(0, 60), rebase=rebase)
    assert np.max(np.abs(gap.append("s", [300]) - rebased.append("s", [300]))) < 0.05


def test_flash_attention_off_is_a_different_block_format(
    make_llama: Callable[..., LlamaExecutor],
) -> None:
    on, off = make_llama(), make_llama(flash_attn=False)
    assert on.fingerprint != off.fingerprint
    for executor in (on, off):
        executor.open_session("s")
        executor.append("s", list(range(300, 340)))
    block = off.export_range("s", Range(0, 20))
    on.evict_range("s", Range(0, 20))
    with pytest.raises(Exception, match="fingerprint"):
        on.import_range("s", block)


def test_kv_profile_and_fingerprint_follow_the_kv_types(
    make_llama: Callable[..., LlamaExecutor], quant_model: Path
) -> None:
    stories = make_llama().kv_profile()
    assert stories == LayerKVProfile(5, 0, 0, 2 * 4 * 8 * 2)  # 640 bytes per token over 5 layers
    f16 = make_llama(model=quant_model)
    q8 = make_llama(model=quant_model, type_k="q8_0", type_v="q8_0")
    assert f16.kv_profile().per_layer_kv_bytes == 2 * 32 * 2
    assert q8.kv_profile().per_layer_kv_bytes == 2 * 34
    assert f16.fingerprint != q8.fingerprint and f16.model_id == q8.model_id


def test_quantized_cells_read_back_as_f16_are_the_f16_cache_within_its_error(
    make_llama: Callable[..., LlamaExecutor], quant_model: Path
) -> None:
    """What a scoring pass over a quantized cache attends with (a recall turn on a q8_0 / q4_0
    tier): its K and V rows dequantized to f16 match an f16 cache of the same tokens to within
    the format's error, q8_0 closer than q4_0."""
    from kvres.actors.engines.llama.recall_exchange import as_f16
    from kvres.actors.engines.llama.state_blob import parse_cells

    def cells(kv: str) -> tuple[np.ndarray, np.ndarray]:
        executor = make_llama(model=quant_model, type_k=kv, type_v=kv)
        executor.open_session("s")
        executor.append("s", TOKENS[:64])
        got = as_f16(parse_cells([executor.export_range("s", Range(0, 64)).payload]), kv, kv)
        assert got.k_types == got.v_types == (1,) * got.k.shape[0] and got.v_el == 2
        return got.k.view("<f2").astype(np.float32), got.v.view("<f2").astype(np.float32)

    exact = cells("f16")
    errors = {}
    for kv in ("q8_0", "q4_0"):
        k, v = cells(kv)
        assert k.shape == exact[0].shape and v.shape == exact[1].shape
        errors[kv] = max(float(np.max(np.abs(k - exact[0]))), float(np.max(np.abs(v - exact[1]))))
        scale = max(float(np.max(np.abs(exact[0]))), float(np.max(np.abs(exact[1]))))
        # one step of the format (amax / 127, amax / 8 per block), compounded over the layers
        assert errors[kv] < (0.02 if kv == "q8_0" else 0.3) * scale, (kv, errors[kv], scale)
    assert 0 < errors["q8_0"] < errors["q4_0"]
    f16 = make_llama(model=quant_model)
    f16.open_session("s")
    f16.append("s", TOKENS[:4])
    with pytest.raises(CapabilityError, match="q5_1"):
        as_f16(parse_cells([f16.export_range("s", Range(0, 4)).payload]), "q5_1", "f16")
