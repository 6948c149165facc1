"""A batch that llama.cpp's CPU flash attention takes in tiles leaves its short items (decodes) to
calls of their own (``engine.call_groups``; docs/notes.md, batching across sessions)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from kvres.actors.engines.llama import LlamaExecutor
from kvres.actors.engines.llama.engine import (
    SHORT_ITEM_TOKENS,
    TILED_ATTENTION_ROWS,
    LlamaContext,
    LlamaModel,
    call_groups,
)
from kvres.actors.engines.llama.llama_errors import ContextFullError

from .conftest import story_tokens


def test_a_batch_within_one_tile_stays_one_call() -> None:
    assert call_groups([40, 1, 1, 1]) == [[0, 1, 2, 3]]
    assert call_groups([TILED_ATTENTION_ROWS - 2, 1, 1]) == [[0, 1, 2]]


def test_past_a_tile_the_short_items_go_first_in_calls_of_their_own() -> None:
    assert call_groups([100, 1, 1, 1, 1, 1]) == [[1, 2, 3, 4, 5], [0]]
    assert call_groups([35, 1, 38, 1, SHORT_ITEM_TOKENS - 1]) == [[1, 3, 4], [0, 2]]
    assert call_groups([TILED_ATTENTION_ROWS, 1]) == [[1], [0]]


def test_short_items_past_a_tile_of_their_own_take_several_calls() -> None:
    lengths = [200] + [SHORT_ITEM_TOKENS - 1] * 10  # 150 short tokens
    groups = call_groups(lengths)
    assert groups[-1] == [0]
    assert sorted(i for g in groups[:-1] for i in g) == list(range(1, 11))
    assert all(sum(lengths[i] for i in g) <= TILED_ATTENTION_ROWS for g in groups[:-1])


def test_all_short_or_all_long_stays_one_call() -> None:
    assert call_groups([1] * 70) == [list(range(70))]
    assert call_groups([40, 40]) == [[0, 1]]
    assert call_groups([]) == [[]]


def _counted(executor: LlamaExecutor) -> list[int]:
    ctx = executor._ctx
    calls: list[int] = []
    decode = ctx._llama_decode

    def counting(ll: object) -> int:
        calls.append(int(ctx._batch.struct.n_tokens))
        return decode(ll)

    ctx._llama_decode = counting  # type: ignore[method-assign]
    return calls


def test_the_executor_isolates_decodes_and_gives_what_each_alone_gives(
        make_llama: Callable[..., LlamaExecutor]) -> None:
    batched, alone = make_llama(), make_llama()
    assert batched._ctx.isolate_short_items  # flash attention, unified cache, no GPU
    prompts = {"a": story_tokens(batched, 40), "b": story_tokens(batched, 30, 1), "c": story_tokens(batched, 30, 2)}
    for ex in (batched, alone):
        for sid, tokens in prompts.items():
            ex.open_session(sid)
            ex.append(sid, tokens)
    calls = _counted(batched)
    step = [("a", story_tokens(batched, 80, 3)), ("b", [prompts["b"][5]]), ("c", [prompts["c"][7]])]
    out = batched.append_many(step)
    assert calls == [2, 80]  # the decodes first, in a call of their own
    for (sid, tokens), logits in zip(step, out, strict=True):
        own = alone.append(sid, tokens)
        assert int(np.argmax(logits)) == int(np.argmax(own))
        np.testing.assert_allclose(logits, own, atol=2e-2)
    calls.clear()
    batched.append_many([("a", [1]), ("b", story_tokens(batched, 20, 4)), ("c", [2])])
    assert calls == [22]  # within one tile: one call


def test_a_failed_call_leaves_every_sequence_as_it_was(stories_model: Path) -> None:
    model = LlamaModel(stories_model)
    ctx = LlamaContext(model, n_ctx=256, n_seq_max=3, flash_attn=True, isolate_short_items=True)
    try:
        for seq in (1, 2):
            ctx.decode([1, 2, 3, 4], 0, seq, logits=False)
        before = [ctx.pos_max(s) for s in range(3)]
        # the two decodes fit and go first; the 300-token prompt does not
        with pytest.raises(ContextFullError):
            ctx.decode_many([(list(range(5, 305)), 0, 0), ([7], 4, 1), ([8], 4, 2)])
        assert [ctx.pos_max(s) for s in range(3)] == before
        ctx.decode_many([([7], 4, 1), ([8], 4, 2)])  # and they go on from where they were
        assert [ctx.pos_max(s) for s in (1, 2)] == [4, 4]
    finally:
        ctx.close()
        model.close()
