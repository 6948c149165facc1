"""Truncation, forks and the tokenizer / model facts a chat session needs, on the real engine."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from kvres.actors.chat_source import ChatTemplateSource
from kvres.actors.engines.llama import LlamaExecutor
from kvres.actors.engines.llama.llama_errors import SessionLimitError
from kvres.policy import Range, RangeError, SessionExistsError, UnknownSessionError
from kvres.policy.tokens import TokenIdError
from models.chat_vocab import CHAT_TEMPLATE

from .chat_gguf import write_chat_model
from .conftest import story_tokens

NEXT = 13


@pytest.fixture(scope="module")
def chat_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_chat_model(tmp_path_factory.mktemp("chat") / "chat.gguf")


def _session(make: Callable[..., LlamaExecutor], chunks: list[list[int]], sid: str = "s", ex: LlamaExecutor | None = None,
             **options: object) -> LlamaExecutor:
    ex = ex or make(**options)
    ex.open_session(sid)
    for chunk in chunks:
        ex.append(sid, chunk)
    return ex


@pytest.mark.parametrize("dropped", [1, 3, 25])
def test_rolling_back_generated_tokens_equals_a_twin_bit_for_bit(
    make_llama: Callable[..., LlamaExecutor], dropped: int
) -> None:
    prompt = story_tokens(make_llama(), 80)
    ex = _session(make_llama, [prompt])
    ex.generate("s", 30, stop_at_eog=False)
    twin = _session(make_llama, [prompt])
    twin.generate("s", 30 - dropped, stop_at_eog=False)
    logits = ex.truncate("s", len(prompt) + 30 - dropped)
    assert ex.token_log("s") == twin.token_log("s")
    assert ex.resident_ranges("s") == twin.resident_ranges("s")
    assert ex.cache_positions("s").tolist() == twin.cache_positions("s").tolist()
    assert logits is not None and np.array_equal(logits, twin.truncate("s", len(twin.token_log("s"))))
    np.testing.assert_array_equal(ex.append("s", [NEXT]), twin.append("s", [NEXT]))
    assert ex.generate("s", 12, stop_at_eog=False) == twin.generate("s", 12, stop_at_eog=False)


def test_truncating_to_an_append_boundary_then_appending_other_tokens_is_exact(
    make_llama: Callable[..., LlamaExecutor],
) -> None:
    tokens = story_tokens(make_llama(), 120)
    ex = _session(make_llama, [tokens[:70], tokens[70:]])
    twin = _session(make_llama, [tokens[:70]])
    ex.truncate("s", 70)
    other = story_tokens(ex, 40, variant=2)
    np.testing.assert_array_equal(ex.append("s", other), twin.append("s", other))
    assert ex.free_cells() == twin.free_cells()


def test_truncating_inside_one_prefill_keeps_the_argmax(make_llama: Callable[..., LlamaExecutor]) -> None:
    """Cut inside a batch the kept tokens' KV was computed with the dropped ones in the same batch,
    which flash attention rounds differently from a batch of the kept ones alone (~1e-2 here)."""
    tokens = story_tokens(make_llama(), 80)
    ex = _session(make_llama, [tokens])
    logits = ex.truncate("s", 50)
    expected = _session(make_llama, []).append("s", tokens[:50])
    assert logits is not None and int(np.argmax(logits)) == int(np.argmax(expected))
    assert np.max(np.abs(logits - expected)) < 0.05


def test_truncate_drops_evicted_and_pending_ranges_past_the_cut(make_llama: Callable[..., LlamaExecutor]) -> None:
    tokens = story_tokens(make_llama(), 160)
    ex = _session(make_llama, [tokens[:100], tokens[100:]])
    ex.evict_range("s", Range(20, 40), rebase=True)
    ex.evict_range("s", Range(100, 110))
    tail = ex.export_range("s", Range(120, 160))
    ex.evict_range("s", Range(120, 160))
    ex.import_range("s", tail)  # pending until the session's next engine operation
    assert ex.truncate("s", 105) is None  # the last kept token is evicted
    assert ex.resident_ranges("s") == [Range(0, 20), Range(40, 100)]
    assert ex.free_cells() == ex.n_ctx - 80
    twin = _session(make_llama, [tokens[:100]])
    twin.evict_range("s", Range(20, 40), rebase=True)
    twin.append("s", tokens[100:105])
    twin.evict_range("s", Range(100, 105))
    assert ex.cache_positions("s").tolist() == twin.cache_positions("s").tolist()
    # the same cells; the new token's cell may land in another free slot (flash-attention rounding)
    np.testing.assert_allclose(ex.append("s", [NEXT]), twin.append("s", [NEXT]), atol=1e-3)
    assert ex.truncate("s", 0) is None
    assert ex.token_log("s") == [] and ex.resident_ranges("s") == [] and ex.free_cells() == ex.n_ctx


def test_truncate_lengths_outside_the_log_are_refused(llama: LlamaExecutor) -> None:
    llama.open_session("s")
    llama.append("s", [1, 400, 401])
    for bad in (-1, 4, 2.0, True):
        with pytest.raises(RangeError, match=f"length={bad!r}"):
            llama.truncate("s", bad)  # type: ignore[arg-type]
    assert llama.token_log("s") == [1, 400, 401]
    with pytest.raises(UnknownSessionError):
        llama.truncate("nope", 0)
    logits = llama.truncate("s", 3)
    assert logits is not None and np.array_equal(logits, llama.truncate("s", 3))


def test_a_fork_continues_independently_and_the_parent_as_if_never_forked(
    make_llama: Callable[..., LlamaExecutor],
) -> None:
    prompt = story_tokens(make_llama(), 60)
    alone = _session(make_llama, [prompt])
    alone_tokens = alone.generate("s", 10, temperature=0.9, seed=1, stop_at_eog=False)
    ex = _session(make_llama, [prompt])
    ex.fork_session("s", "f")
    assert ex.token_log("f") == prompt and ex.resident_ranges("f") == [Range(0, 60)]
    assert ex.generate("s", 10, temperature=0.9, seed=1, stop_at_eog=False) == alone_tokens
    fork_tokens = ex.generate("f", 10, temperature=0.9, seed=2, stop_at_eog=False)
    assert fork_tokens != alone_tokens
    assert ex.token_log("s") == prompt + alone_tokens and ex.token_log("f") == prompt + fork_tokens
    # the fork holds the parent's cells: a fresh session with the fork's seed goes the same way, up
    # to the rounding of the parent's masked cells in between (test_mechanism: isolation)
    other = _session(make_llama, [prompt])
    assert other.generate("s", 10, temperature=0.9, seed=2, stop_at_eog=False) == fork_tokens
    np.testing.assert_allclose(ex.append("f", [NEXT]), other.append("s", [NEXT]), atol=5e-3)
    ex.close_session("s")  # the shared cells stay the fork's
    assert ex.token_log("f") == prompt + fork_tokens + [NEXT]
    assert ex.free_cells() == ex.n_ctx - 71
    assert np.all(np.isfinite(ex.append("f", [NEXT])))


def test_fork_errors(make_llama: Callable[..., LlamaExecutor]) -> None:
    ex = make_llama(n_seq_max=2)
    ex.open_session("a")
    ex.append("a", [1, 400, 401])
    with pytest.raises(UnknownSessionError):
        ex.fork_session("nope", "b")
    with pytest.raises(SessionExistsError):
        ex.fork_session("a", "a")
    ex.fork_session("a", "b")
    with pytest.raises(SessionLimitError, match="n_seq_max=2"):
        ex.fork_session("a", "c")
    assert ex.sessions() == ["a", "b"]


@pytest.mark.parametrize("mover", ["f", "s"])
def test_re_basing_one_side_of_a_fork_leaves_the_other(make_llama: Callable[..., LlamaExecutor], mover: str) -> None:
    """A K-shift moves a cell for every sequence holding it: before either side re-bases, the fork
    gets its own copy of the shared cells (the source keeps its layout); both stay exact."""
    tokens = story_tokens(make_llama(), 100)
    ex = _session(make_llama, [tokens])
    expected = _session(make_llama, [tokens]).append("s", [NEXT])
    moved = _session(make_llama, [tokens])
    moved.evict_range("s", Range(10, 60), rebase=True)
    expected_moved = moved.append("s", [NEXT])
    ex.fork_session("s", "f")
    ex.evict_range(mover, Range(10, 60), rebase=True)
    np.testing.assert_array_equal(ex.append(mover, [NEXT]), expected_moved)
    np.testing.assert_array_equal(ex.append("s" if mover == "f" else "f", [NEXT]), expected)
    assert ex.cache_positions(mover)[60:].tolist() == list(range(10, 51))


def test_end_of_generation_and_token_id_checks(llama: LlamaExecutor) -> None:
    assert llama.end_of_generation() == frozenset({2})
    assert llama.n_vocab == 512
    for bad in ([512], [-1], [1, 2**31]):
        with pytest.raises(TokenIdError, match=r"outside the vocabulary \[0, 512\)"):
            llama.detokenize(bad)
    assert llama.detokenize([511]) is not None  # the last id is fine
    tokens = llama.tokenize("Once upon a time")
    assert llama.detokenize([*tokens, 2], special=True) == "<s> Once upon a time</s>"
    assert llama.detokenize([*tokens, 2]).strip() == "Once upon a time"
    assert llama.tokenize("<s>hi</s>", add_bos=False, special=True)[0] == 1
    assert 1 not in llama.tokenize("<s>hi</s>", add_bos=False)
    assert llama.chat_template() is None  # stories260K has none


def test_chat_template_and_control_tokens(make_llama: Callable[..., LlamaExecutor], chat_model: Path) -> None:
    ex = make_llama(model=chat_model)
    assert ex.chat_template() == ChatTemplateSource(CHAT_TEMPLATE, "<s>", "</s>", 1, 2, True)
    ids = ex.tokenize("<|user|>\nhello world</s>\n", add_bos=True, special=True)
    user = ids[1]
    assert ids[0] == 1 and ex.detokenize([user], special=True) == "<|user|>"
    assert ex.detokenize(ids, special=True) == "<s><|user|>\nhello world</s>\n"
    assert user not in ex.tokenize("<|user|>", add_bos=False)  # plain text stays text
    assert 2 in ex.end_of_generation()
