"""The llama.cpp recall mechanism on the committed passkey model: state blobs as arrays, keys
moved in numpy as llama.cpp's K-shift would, a batched exchange that matches range-by-range
eviction and import, cold blocks scored without importing them, and a turn the scoring pass
decoded taken by the next append instead of decoding it again."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from kvres.actors.engines.llama import LlamaExecutor
from kvres.actors.engines.llama.ggml_tensors import f16_to_f32, f32_to_f16
from kvres.actors.engines.llama.state_blob import parse_cells
from kvres.policy import BlockMismatchError, RangeError
from kvres.policy.ranges import Range
from tests.conftest import shared_model_path

PASSKEY = Path(__file__).resolve().parents[2] / "models" / "passkey.gguf"
TOKENS = [int(t) for t in np.random.default_rng(0).integers(3, 120, 300)]
TURN = [int(t) for t in np.random.default_rng(1).integers(3, 120, 8)]
SPILLED = [Range(40, 80), Range(100, 104), Range(160, 200)]
# llama.cpp's flash-attention kernel accumulates V in f16 by cell order; the scoring context has
# no flash attention: logits of the same cells then agree to this much (measured ~2e-2 at most)
FLASH_VS_PLAIN = 0.1


@pytest.fixture()
def ex() -> Iterator[LlamaExecutor]:
    executor = LlamaExecutor(PASSKEY, n_ctx=1024, n_seq_max=4, n_threads=1)
    yield executor
    executor.close()


def _spilled(ex: LlamaExecutor, sid: str, rebase: bool) -> dict[Range, object]:
    ex.open_session(sid)
    ex.append(sid, TOKENS)
    blocks = {}
    for rng in sorted(SPILLED, reverse=True):
        blocks[rng] = ex.export_range(sid, rng)
        ex.evict_range(sid, rng, rebase=rebase)
    return blocks


def test_state_blobs_round_trip_as_arrays(ex: LlamaExecutor) -> None:
    ex.open_session("s")
    ex.append("s", TOKENS[:64])
    blob = ex._ctx.state_get(ex._sessions["s"].seq)
    cells = parse_cells([blob])
    assert cells.positions.tolist() == list(range(64)) and cells.k.shape[:2] == (ex.geometry.n_layers, 64)
    assert cells.to_blob(v_trans=False, seq=int.from_bytes(blob[4:8], "little")) == blob
    blocks = [ex.export_range("s", Range(i, i + 8)) for i in range(0, 64, 8)]
    many = parse_cells([b.payload for b in blocks])
    assert np.array_equal(many.k, cells.k) and np.array_equal(many.v, cells.v)
    # V stored transposed (no flash attention) comes back row-wise, and goes back transposed
    back = parse_cells([cells.to_blob(v_trans=True)])
    assert np.array_equal(back.v, cells.v) and np.array_equal(back.k, cells.k)
    with pytest.raises(BlockMismatchError):
        parse_cells([blob[:-4]])


def test_f16_conversions_match_numpy() -> None:
    values = np.random.default_rng(0).normal(size=4096).astype(np.float32) * 100
    halves = f32_to_f16(values)
    assert np.array_equal(halves, values.astype(np.float16))
    assert np.array_equal(f16_to_f32(halves), halves.astype(np.float32))


@pytest.mark.parametrize("which", ["passkey", "stories260K"])
def test_keys_moved_in_numpy_match_llamas_k_shift(which: str) -> None:
    model = PASSKEY if which == "passkey" else shared_model_path()
    with LlamaExecutor(model, n_ctx=1024, n_seq_max=3, n_threads=1) as ex:
        toks = [t % ex.n_vocab for t in TOKENS]
        for sid in ("shifted", "exchanged", "whole"):
            ex.open_session(sid)
            ex.append(sid, toks)
        ex.evict_range("shifted", Range(100, 200), rebase=True)
        ex.exchange("exchanged", [Range(100, 200)], [], rebase=True)
        assert (ex.cache_positions("shifted") == ex.cache_positions("exchanged")).all()
        a, b, whole = (ex.append(sid, TURN) for sid in ("shifted", "exchanged", "whole"))
        assert np.abs(a - b).max() < 1e-2 < np.abs(a - whole).max()


def test_exchange_matches_range_by_range_eviction_and_import(ex: LlamaExecutor) -> None:
    one, many = _spilled(ex, "one", rebase=False), _spilled(ex, "many", rebase=False)
    kept = [Range(40, 80), Range(160, 200)]
    exported = ex.export_range("many", Range(240, 260))
    ex.evict_range("one", Range(240, 260))
    for rng in kept:
        ex.import_range("one", one[rng])
    out = ex.exchange("many", [Range(240, 260)], [many[rng] for rng in kept], rebase=False)
    assert ex.resident_ranges("many") == ex.resident_ranges("one")
    assert (ex.cache_positions("many") == ex.cache_positions("one")).all()
    assert out[0].positions == exported.positions and out[0].token_ids == exported.token_ids
    same = parse_cells([out[0].payload]), parse_cells([exported.payload])
    assert np.array_equal(same[0].k, same[1].k) and np.array_equal(same[0].v, same[1].v)
    # same cells at the same positions, in other cache slots: attention sums them in another order
    a, b = ex.append("one", TURN), ex.append("many", TURN)
    assert np.abs(a - b).max() < 1e-2 and a.argmax() == b.argmax()
    with pytest.raises(RangeError):  # 40..80 is resident now: nothing changes
        ex.exchange("many", [], [many[Range(40, 80)]], rebase=False)


def test_recall_attention_scores_cold_blocks_as_if_resident(ex: LlamaExecutor) -> None:
    blocks = _spilled(ex, "spilled", rebase=False)
    ex.open_session("whole")
    ex.append("whole", TOKENS + TURN)
    before = ex.cache_positions("spilled").copy()
    capture = ex.recall_attention("spilled", list(blocks.values()), TURN, len(TURN), rebase=False)
    reference = ex.attention("whole", len(TURN))  # everything resident, re-prefilled
    assert (ex.cache_positions("spilled") == before).all()  # the session did not change
    assert capture.key_positions.tolist() == list(range(len(TOKENS) + len(TURN)))
    assert capture.query_positions.tolist() == list(range(len(TOKENS), len(TOKENS) + len(TURN)))
    assert capture.probs.shape == reference.probs.shape
    assert np.abs(capture.probs - reference.probs).max() < 2e-3


def test_the_scored_turn_is_taken_by_the_next_append(ex: LlamaExecutor) -> None:
    taken, decoded = _spilled(ex, "taken", rebase=True), _spilled(ex, "decoded", rebase=True)
    ex.recall_attention("taken", list(taken.values()), TURN, 4, rebase=True)
    ex.exchange("taken", [], list(taken.values()), rebase=True)
    ex.exchange("decoded", [], list(decoded.values()), rebase=True)
    assert ex._sessions["taken"].prefill is not None
    a, b = ex.append("taken", TURN), ex.append("decoded", TURN)
    assert ex._sessions["taken"].prefill is None and ex.token_log("taken") == ex.token_log("decoded")
    assert (ex.cache_positions("taken") == ex.cache_positions("decoded")).all()
    assert np.abs(a - b).max() < FLASH_VS_PLAIN
    nxt = [int(np.argmax(a))]
    assert np.abs(ex.append("taken", nxt) - ex.append("decoded", nxt)).max() < FLASH_VS_PLAIN


def test_a_different_append_discards_the_scored_turn(ex: LlamaExecutor) -> None:
    taken = _spilled(ex, "taken", rebase=False)
    _spilled(ex, "decoded", rebase=False)
    ex.recall_attention("taken", list(taken.values()), TURN, 4, rebase=False)
    other = TURN[::-1]
    assert np.abs(ex.append("taken", other) - ex.append("decoded", other)).max() < 1e-3
    assert ex._sessions["taken"].prefill is None



def test_a_dropped_executor_frees_its_engine_at_once() -> None:
    """The recall half holds no strong reference back to its executor: dropping an executor that
    recalled (without ``close``) frees its contexts at once, not at some later GC pass."""
    executor = LlamaExecutor(PASSKEY, n_ctx=1024, n_seq_max=4, n_threads=1)
    blocks = list(_spilled(executor, "s", rebase=False).values())
    assert executor.prepare_recall("s", blocks, False)
    executor.recall_attention("s", blocks, TURN, 4, False)
    executor.exchange("s", [], blocks, False)
    gone = weakref.ref(executor)
    gc.disable()
    try:
        del executor
        assert gone() is None
    finally:
        gc.enable()
