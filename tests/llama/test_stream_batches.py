"""A split KV layout's steps: llama.cpp cuts a batch over several streams into one micro-batch per
run of consecutive sequence ids (``stream_batches.micro_batches`` counts them as llama.cpp does);
idle streams between the busy ones get a throwaway token where that saves passes, and nothing of
theirs changes; sessions take the lowest free sequence; the split layout runs without flash
attention on the CPU by default, and its blocks say so when another format refuses them."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np
import pydantic
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvres.actors.config import BackendConfig
from kvres.actors.engines.llama import LlamaExecutor
from kvres.actors.engines.llama import library as llama_library
from kvres.actors.engines.llama.engine import LlamaContext, LlamaModel
from kvres.actors.engines.llama.stream_batches import FILLER_ROW_COST, MAX_GAP, gap_fillers, micro_batches
from kvres.coldstore.block import BlockFingerprintError
from kvres.policy import Range
from tests.conftest import shared_model_path
from tests.hypothesis_profiles import examples

from .conftest import story_tokens

STREAMS = 8


def _count_micro_batches(ctx: LlamaContext, items: list[tuple[list[int], int, int]]) -> int:
    """How many micro-batches llama.cpp ran for one ``decode_many`` (its batch debug log)."""
    llama_library._listening.lines = []
    try:
        ctx.decode_many(items)
        lines = llama_library._listening.lines
    finally:
        llama_library._listening.lines = None
    return sum("added ubatch" in line for line in lines)


@pytest.fixture(scope="module")
def debug_split_context() -> Iterator[LlamaContext]:
    mp = pytest.MonkeyPatch()
    mp.setenv("LLAMA_BATCH_DEBUG", "1")  # read when the context is made
    model = LlamaModel(shared_model_path())
    ctx = LlamaContext(model, n_ctx=64 * STREAMS, n_seq_max=STREAMS, kv_unified=False, flash_attn=False,
                       n_batch=64)
    mp.undo()
    yield ctx
    ctx.close()
    model.close()


@settings(max_examples=examples(40), deadline=None)
@given(st.dictionaries(st.integers(0, STREAMS - 1), st.integers(1, 6), min_size=1, max_size=STREAMS))
def test_micro_batches_counts_what_llama_cpp_runs(debug_split_context: LlamaContext, lengths: dict[int, int]) -> None:
    ctx = debug_split_context
    ctx.clear()
    items = sorted(lengths.items())
    batch = [([5 + i for i in range(n)], 0, seq) for seq, n in items]
    assert _count_micro_batches(ctx, batch) == micro_batches(items, ctx.n_batch)


def test_a_step_in_sequence_order_runs_one_pass_per_run(debug_split_context: LlamaContext) -> None:
    ctx = debug_split_context
    ctx.clear()
    assert _count_micro_batches(ctx, [([5], 0, s) for s in (0, 1, 2, 4, 5, 7)]) == 3
    ctx.clear()
    assert _count_micro_batches(ctx, [([5], 0, s) for s in range(6)]) == 1
    ctx.clear()
    assert _count_micro_batches(ctx, [([5], 0, 1), ([5], 0, 0)]) == 2  # llama.cpp takes them in batch order


def test_gaps_are_filled_where_that_saves_passes() -> None:
    def decodes(*seqs: int) -> list[tuple[int, int]]:
        return [(s, 1) for s in seqs]

    anything = lambda s: True  # noqa: E731
    assert gap_fillers(decodes(0, 1, 2, 4, 5, 7), 512, anything) == [3, 6]
    assert gap_fillers(decodes(5, 1, 3), 512, anything) == [2, 4]  # the items' order does not matter
    assert gap_fillers(decodes(0, 1, 2, 3), 512, anything) == []  # one run already
    assert gap_fillers(decodes(0, 0 + MAX_GAP + 2), 512, anything) == []  # too wide: another pass is cheaper
    assert gap_fillers(decodes(0, 2, 4), 512, lambda s: s != 3) == [1]  # a full stream takes no filler
    assert gap_fillers([(0, 35), (2, 35)], 512, anything) == []  # two prompts: a filler would cut them
    assert gap_fillers([(0, 1), (1, 35), (3, 1)], 512, anything) == [2]
    assert FILLER_ROW_COST * MAX_GAP < 1 < FILLER_ROW_COST * (MAX_GAP + 1)


def _sessions(ex: LlamaExecutor, n: int) -> list[str]:
    story = story_tokens(ex, 80)
    names = [f"s{i}" for i in range(n)]
    for i, name in enumerate(names):
        ex.open_session(name)
        ex.append(name, story[i : i + 20 + 3 * i])
    return names


@pytest.fixture
def split_pair(make_llama: Callable[..., LlamaExecutor],
               monkeypatch: pytest.MonkeyPatch) -> tuple[LlamaExecutor, LlamaExecutor]:
    monkeypatch.setenv("LLAMA_BATCH_DEBUG", "1")
    return make_llama(kv_layout="split", n_seq_max=STREAMS), make_llama(kv_layout="split", n_seq_max=STREAMS)


def test_filled_steps_give_each_session_what_it_gets_alone(split_pair: tuple[LlamaExecutor, LlamaExecutor]) -> None:
    batched, alone = split_pair
    names = _sessions(batched, STREAMS)
    assert _sessions(alone, STREAMS) == names
    assert [batched._sessions[n].seq for n in names] == list(range(STREAMS))  # lowest free sequence first
    busy = ["s0", "s1", "s2", "s4", "s5", "s7"]  # s3 and s6 get throwaway tokens
    for step in range(4):
        step_tokens = [[40 + step + i] for i in range(len(busy))]
        llama_library._listening.lines = []
        try:
            together = batched.append_many(list(zip(busy, step_tokens, strict=True)))
            assert sum("added ubatch" in line for line in llama_library._listening.lines) == 1  # not 3
        finally:
            llama_library._listening.lines = None
        for name, toks, logits in zip(busy, step_tokens, together, strict=True):
            # rows batched differently round differently (docs/notes.md): no more than that (2.02e-3
            # measured with AVX-512 kernels, under 2e-3 with AVX2's)
            assert float(np.abs(alone.append(name, toks) - logits).max()) < 5e-3
    for name in names:
        assert batched.token_log(name) == alone.token_log(name)
        assert batched.resident_ranges(name) == [Range(0, len(alone.token_log(name)))]
    for name in ("s3", "s6"):  # the idle ones hold exactly what they held and go on exactly alike
        assert batched.generate(name, 6) == alone.generate(name, 6)
    assert batched.free_cells() == alone.free_cells()


def test_a_full_idle_stream_gets_no_filler(make_llama: Callable[..., LlamaExecutor]) -> None:
    ex = make_llama(kv_layout="split", n_seq_max=4, n_ctx=256)  # 64 cells a stream
    names = _sessions(ex, 3)
    ex.append("s1", [7] * (64 - len(ex.token_log("s1"))))  # its stream is full
    ex.append_many([("s0", [9]), ("s2", [9])])
    assert len(ex.token_log("s1")) == 64 and ex.resident_ranges("s1") == [Range(0, 64)]
    assert [len(ex.token_log(n)) for n in names] == [21, 64, 27]


def test_the_split_layout_runs_without_flash_attention_on_the_cpu(make_llama: Callable[..., LlamaExecutor]) -> None:
    split, unified = make_llama(kv_layout="split"), make_llama()
    assert (split.flash_attn, unified.flash_attn, make_llama(kv_layout="split", flash_attn=True).flash_attn) \
        == (False, True, True)
    split.open_session("s")
    split.append("s", story_tokens(split, 30))
    block = split.export_range("s", Range(0, 30))
    unified.open_session("s", split.token_log("s"))
    with pytest.raises(BlockFingerprintError, match="payload llama-state-seq/v-trans"):
        unified.import_range("s", block)  # V rows stored transposed: another payload


def test_flash_attention_settings_are_checked() -> None:
    with pytest.raises(pydantic.ValidationError, match=r"type_v='q8_0' needs flash attention"):
        BackendConfig(type_k="q8_0", type_v="q8_0", flash_attn=False)
    with pytest.raises(pydantic.ValidationError, match=r"flash_attn=True is a llama.cpp setting"):
        BackendConfig(engine="openvino", flash_attn=True)
    assert BackendConfig(kv_layout="split", flash_attn=True).flash_attn is True
