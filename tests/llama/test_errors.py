"""Bad input: each a typed error naming the value, and the executor usable afterwards."""

from __future__ import annotations

import dataclasses
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from kvres.actors.engines.llama import ContextFullError, LlamaExecutor, SessionLimitError
from kvres.coldstore.errors import BlockFingerprintError
from kvres.policy import (
    BlockMismatchError,
    ModelLoadError,
    Range,
    RangeError,
    SessionExistsError,
    UnknownSessionError,
)

from .conftest import story_tokens


def _state(executor: LlamaExecutor, sid: str = "s") -> tuple[list[Range], list[int], list[int]]:
    return (executor.resident_ranges(sid), executor.token_log(sid),
            executor.cache_positions(sid).tolist())


def _still_serves(executor: LlamaExecutor, sid: str = "s") -> None:
    assert np.all(np.isfinite(executor.append(sid, [13])))


def test_missing_model_file(tmp_path: Path) -> None:
    missing = tmp_path / "nope.gguf"
    with pytest.raises(ModelLoadError, match="nope.gguf"):
        LlamaExecutor(missing, n_ctx=64, n_threads=1)


def test_model_file_that_is_not_gguf(tmp_path: Path) -> None:
    bogus = tmp_path / "weights.bin"
    bogus.write_bytes(b"PK\x03\x04 definitely not a gguf file")
    with pytest.raises(ModelLoadError, match="weights.bin"):
        LlamaExecutor(bogus, n_ctx=64, n_threads=1)


@pytest.mark.parametrize("n_ctx", [63, 1001, 16, 0, -2])
def test_bad_n_ctx(stories_model: Path, n_ctx: int) -> None:
    with pytest.raises(ValueError, match=f"n_ctx={n_ctx}"):
        LlamaExecutor(stories_model, n_ctx=n_ctx, n_threads=1)


def test_bad_kv_types(stories_model: Path) -> None:
    with pytest.raises(ValueError, match="type_k='q5_k'"):
        LlamaExecutor(stories_model, n_ctx=64, type_k="q5_k", n_threads=1)
    with pytest.raises(ValueError, match="type_v='q4_0'.*flash"):
        LlamaExecutor(stories_model, n_ctx=64, type_v="q4_0", flash_attn=False, n_threads=1)
    with pytest.raises(ValueError, match="head_dim 8"):  # stories260K cannot hold q8_0 blocks
        LlamaExecutor(stories_model, n_ctx=64, type_k="q8_0", n_threads=1)


@pytest.mark.parametrize(
    "operation",
    [
        lambda e: e.evict_range("s", Range(90, 130)),
        lambda e: e.admit_range("s", Range(50, 60)),
        lambda e: e.export_range("s", Range(15, 25)),
        lambda e: e.admit_range("s", Range(100, 101)),
    ],
    ids=["evict-outside", "admit-resident", "export-partly-evicted", "admit-beyond-log"],
)
def test_ranges_outside_the_session(llama: LlamaExecutor, operation: Callable[[LlamaExecutor], object]) -> None:
    llama.open_session("s")
    llama.append("s", story_tokens(llama, 100))
    llama.evict_range("s", Range(20, 30))
    before = _state(llama)
    with pytest.raises(RangeError, match=r"\[\d+, \d+\)"):
        operation(llama)
    assert _state(llama) == before
    _still_serves(llama)


def test_unknown_and_duplicate_session_ids(llama: LlamaExecutor) -> None:
    for call in (
        lambda: llama.append("ghost", [1]),
        lambda: llama.token_log("ghost"),
        lambda: llama.evict_range("ghost", Range(0, 1)),
        lambda: llama.generate("ghost", 3),
        lambda: llama.close_session("ghost"),
    ):
        with pytest.raises(UnknownSessionError, match="ghost"):
            call()
    llama.open_session("s")
    with pytest.raises(SessionExistsError, match="'s'"):
        llama.open_session("s")
    _still_serves(llama)


def test_bad_tokens(llama: LlamaExecutor) -> None:
    llama.open_session("s")
    with pytest.raises(ValueError, match="= 9999 is outside the vocabulary"):
        llama.append("s", [1, 9999])
    with pytest.raises(ValueError, match="at least one token"):
        llama.append("s", [])
    assert llama.token_log("s") == []
    _still_serves(llama)


def test_block_from_another_model(make_llama: Callable[..., LlamaExecutor], stories_model: Path,
                                  tmp_path: Path) -> None:
    twin = tmp_path / "stories-copy.gguf"
    shutil.copyfile(stories_model, twin)
    with twin.open("ab") as fh:
        fh.write(b"\0" * 32)  # other bytes, so another model id; llama.cpp still loads it
    source = make_llama(model=twin)
    source.open_session("s")
    tokens = story_tokens(source, 80)
    source.append("s", tokens)
    block = source.export_range("s", Range(0, 40))
    target = make_llama()
    assert target.model_id != source.model_id
    target.open_session("s")
    target.append("s", tokens)
    target.evict_range("s", Range(0, 40))
    before = _state(target)
    with pytest.raises(BlockFingerprintError, match="sha256:"):
        target.import_range("s", block)
    assert _state(target) == before
    _still_serves(target)


def test_block_with_other_kv_types(make_llama: Callable[..., LlamaExecutor], quant_model: Path) -> None:
    source = make_llama(model=quant_model, type_k="q8_0", type_v="q8_0")
    target = make_llama(model=quant_model)
    tokens = list(range(300, 318)) * 4
    for executor in (source, target):
        executor.open_session("s")
        executor.append("s", tokens)
    block = source.export_range("s", Range(8, 40))
    target.evict_range("s", Range(8, 40))
    with pytest.raises(BlockMismatchError, match="q8_0/q8_0"):
        target.import_range("s", block)
    _still_serves(target)


def test_damaged_or_misfiled_blocks(llama: LlamaExecutor) -> None:
    llama.open_session("s")
    tokens = story_tokens(llama, 80)
    llama.append("s", tokens)
    block = llama.export_range("s", Range(10, 30))
    llama.evict_range("s", Range(10, 30))
    before = _state(llama)
    payload = bytes(block.payload)
    damaged = [
        dataclasses.replace(block, payload=payload[:-7]),  # truncated
        dataclasses.replace(block, payload=b"\0" * len(payload)),  # not a state blob
        dataclasses.replace(block, token_ids=(5,) * 20),  # another session's text
        dataclasses.replace(block, positions=tuple(range(100, 120))),  # header disagrees
    ]
    for bad in damaged:
        with pytest.raises(BlockMismatchError):
            llama.import_range("s", bad)
        assert _state(llama) == before
    llama.import_range("s", block)
    assert llama.resident_ranges("s") == [Range(0, 80)]


def test_context_full_leaves_the_log_intact(make_llama: Callable[..., LlamaExecutor]) -> None:
    executor = make_llama(n_ctx=64, n_seq_max=2)
    executor.open_session("s")
    tokens = story_tokens(executor, 80)
    executor.append("s", tokens[:60])
    before = _state(executor)
    with pytest.raises(ContextFullError, match="n_ctx=64") as info:
        executor.append("s", tokens[60:70])
    assert (info.value.needed, info.value.free) == (10, 4)
    assert _state(executor) == before
    executor.open_session("t")
    with pytest.raises(ContextFullError):
        executor.append("t", tokens[:5])
    executor.evict_range("s", Range(4, 20), rebase=True)
    executor.append("t", tokens[:5])
    _still_serves(executor)


def test_more_sessions_than_sequences(make_llama: Callable[..., LlamaExecutor]) -> None:
    executor = make_llama(n_ctx=128, n_seq_max=2)
    executor.open_session("a")
    executor.open_session("b")
    with pytest.raises(SessionLimitError, match="n_seq_max=2"):
        executor.open_session("c")
    assert executor.sessions() == ["a", "b"]
    executor.close_session("a")
    executor.open_session("c")
    _still_serves(executor, "c")


def test_n_seq_max_bounds(stories_model: Path) -> None:
    with pytest.raises(ValueError, match="n_seq_max=0"):
        LlamaExecutor(stories_model, n_ctx=64, n_seq_max=0, n_threads=1)
    with pytest.raises(ValueError, match="n_seq_max=200"):
        LlamaExecutor(stories_model, n_ctx=64, n_seq_max=200, n_threads=1)
