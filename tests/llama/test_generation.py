"""Decoding loops, tokenizer helpers and model identity."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from kvres.actors.engines.llama import LlamaExecutor
from kvres.policy import Range

from .conftest import STORY, story_tokens


def test_greedy_generate_matches_a_manual_argmax_loop(make_llama: Callable[..., LlamaExecutor]) -> None:
    prompt = story_tokens(make_llama(), 60)
    manual = make_llama()
    manual.open_session("s")
    logits = manual.append("s", prompt)
    expected = []
    for _ in range(12):
        token = int(np.argmax(logits))
        expected.append(token)
        logits = manual.append("s", [token])
    executor = make_llama()
    executor.open_session("s")
    executor.append("s", prompt)
    got = executor.generate("s", 12, stop_at_eog=False)
    assert got == expected
    assert executor.token_log("s") == prompt + got


def test_seeded_sampling_is_reproducible(make_llama: Callable[..., LlamaExecutor]) -> None:
    runs = []
    for seed in (7, 7, 8):
        executor = make_llama()
        executor.open_session("s")
        executor.append("s", story_tokens(executor, 20))
        runs.append(executor.generate("s", 24, temperature=1.0, seed=seed, stop_at_eog=False))
    assert runs[0] == runs[1]
    assert runs[0] != runs[2]


def test_stream_yields_what_generate_returns(make_llama: Callable[..., LlamaExecutor]) -> None:
    outputs = []
    for streaming in (False, True):
        executor = make_llama()
        executor.open_session("s")
        executor.append("s", story_tokens(executor, 30))
        if streaming:
            stream = executor.stream("s", 10, temperature=0.8, seed=3, stop_at_eog=False)
            first = next(stream)
            assert executor.token_log("s")[-1] == first  # appended as soon as it is yielded
            outputs.append([first, *stream])
        else:
            outputs.append(executor.generate("s", 10, temperature=0.8, seed=3, stop_at_eog=False))
    assert outputs[0] == outputs[1]


def test_generation_after_eviction_recomputes_the_last_token(
    make_llama: Callable[..., LlamaExecutor],
) -> None:
    """Logits cached before an eviction are stale; generate re-decodes the last token first."""
    tokens = story_tokens(make_llama(), 120)
    executor = make_llama()
    executor.open_session("s")
    executor.append("s", tokens)
    executor.evict_range("s", Range(4, 100), rebase=True)
    got = executor.generate("s", 1)
    reference = make_llama()
    reference.open_session("s")
    reference.append("s", tokens[:-1])
    reference.evict_range("s", Range(4, 100), rebase=True)
    assert got == [int(np.argmax(reference.append("s", tokens[-1:])))]


def test_generate_stops_at_end_of_generation(
    make_llama: Callable[..., LlamaExecutor], monkeypatch: pytest.MonkeyPatch
) -> None:
    """stories260K never writes </s> greedily, so the third greedy token plays end-of-generation."""
    prompt = story_tokens(make_llama(), 30)
    free = make_llama()
    free.open_session("s")
    free.append("s", prompt)
    unstopped = free.generate("s", 6)
    executor = make_llama()
    monkeypatch.setattr(executor._model, "is_eog", lambda token: token == unstopped[2])
    executor.open_session("s")
    executor.append("s", prompt)
    assert executor.generate("s", 6) == unstopped[:3]
    assert executor.token_log("s") == prompt + unstopped[:3]


def test_bad_generation_arguments(llama: LlamaExecutor) -> None:
    llama.open_session("s")
    with pytest.raises(ValueError, match="no tokens"):
        llama.generate("s", 3)
    llama.append("s", [1, 400])
    with pytest.raises(ValueError, match="max_tokens=-1"):
        llama.generate("s", -1)
    with pytest.raises(ValueError, match="temperature"):
        llama.generate("s", 2, temperature=-0.5)
    assert llama.generate("s", 0) == []


def test_tokenize_round_trip_and_identity(llama: LlamaExecutor, stories_model: Path) -> None:
    text = "Lily saw a big red ball."
    tokens = llama.tokenize(text)
    assert tokens[0] == 1 and llama.tokenize(text, add_bos=False) == tokens[1:]
    assert llama.detokenize(tokens[1:]).strip() == text
    assert llama.model_id == "sha256:" + hashlib.sha256(stories_model.read_bytes()).hexdigest()
    assert len(llama.fingerprint) == 32
    assert llama.n_ctx == 1024 and llama.n_vocab == 512
    assert STORY  # the fixtures' text

