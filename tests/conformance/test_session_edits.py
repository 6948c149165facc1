"""Truncation, forks and token facts, the same on every executor of the conformance table."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from kvres.actors.sampling import SamplingParams
from kvres.policy import Range, RangeError, SessionExistsError
from kvres.policy.tokens import TokenIdError

from .scenarios import prompt_tokens

NEXT = 5


def _atol(executor: Any) -> float:
    """llama.cpp and the reference are exact when the same chunks are appended; OpenVINO (float32)
    recomputes the last kept token's logits on its own."""
    return 1e-4 if executor.engine == "openvino" else 0.0


def _twin(make_executor: Callable[[], Any], chunks: list[list[int]]) -> Any:
    twin = make_executor()
    twin.open_session("s")
    for chunk in chunks:
        twin.append("s", chunk)
    return twin


def test_truncate_then_append_equals_a_twin(make_executor: Callable[[], Any]) -> None:
    tokens = prompt_tokens(120)
    ex = _twin(make_executor, [tokens[:90], tokens[90:100], tokens[100:]])
    ex.evict_range("s", Range(20, 40), rebase=True)
    ex.evict_range("s", Range(110, 120))
    logits = ex.truncate("s", 100)
    twin = _twin(make_executor, [tokens[:90], tokens[90:100]])
    twin.evict_range("s", Range(20, 40), rebase=True)
    expected = twin.truncate("s", 100)  # the logits after the eviction (no change to the log)
    assert ex.token_log("s") == twin.token_log("s")
    assert ex.resident_ranges("s") == twin.resident_ranges("s") == [Range(0, 20), Range(40, 100)]
    assert ex.cache_positions("s").tolist() == twin.cache_positions("s").tolist()
    atol = _atol(ex)
    assert logits is not None
    np.testing.assert_allclose(logits, expected, atol=atol, rtol=0)
    np.testing.assert_allclose(ex.append("s", [NEXT]), twin.append("s", [NEXT]), atol=atol, rtol=0)


def test_truncate_bounds(make_executor: Callable[[], Any]) -> None:
    ex = _twin(make_executor, [prompt_tokens(30)])
    for bad in (-1, 31):
        with pytest.raises(RangeError, match=f"length={bad}"):
            ex.truncate("s", bad)
    assert ex.token_log("s") == prompt_tokens(30)
    ex.evict_range("s", Range(20, 30))
    assert ex.truncate("s", 25) is None  # its last token is not resident
    assert ex.truncate("s", 0) is None and ex.token_log("s") == [] and ex.resident_ranges("s") == []


def test_a_fork_goes_on_independently(make_executor: Callable[[], Any]) -> None:
    tokens = prompt_tokens(80)
    ex = _twin(make_executor, [tokens])
    ex.evict_range("s", Range(10, 20))
    ex.fork_session("s", "f")
    with pytest.raises(SessionExistsError):
        ex.fork_session("s", "f")
    assert ex.token_log("f") == tokens and ex.resident_ranges("f") == [Range(0, 10), Range(20, 80)]
    ex.append("f", [7, 8, 9])
    ex.evict_range("f", Range(30, 50), rebase=True)
    twin = _twin(make_executor, [tokens])
    twin.evict_range("s", Range(10, 20))
    np.testing.assert_allclose(ex.append("s", [NEXT]), twin.append("s", [NEXT]), atol=_atol(ex), rtol=0)
    assert ex.token_log("f") == tokens + [7, 8, 9]
    assert ex.resident_ranges("f") == [Range(0, 10), Range(20, 30), Range(50, 83)]
    assert np.all(np.isfinite(ex.append("f", [NEXT])))


def test_token_facts(make_executor: Callable[[], Any]) -> None:
    ex = make_executor()
    n = ex.n_vocab
    assert isinstance(n, int) and n >= 60
    assert isinstance(ex.end_of_generation(), frozenset)
    with pytest.raises(TokenIdError, match=rf"= {n} is outside the vocabulary \[0, {n}\)"):
        ex.detokenize([3, n])
    assert isinstance(ex.detokenize([3, 4], special=True), str)
    sampler = ex.sampler(SamplingParams(temperature=0.5, seed=1, top_k=10))
    sampler.prime(prompt_tokens(10))
    logits = np.linspace(0, 1, n, dtype=np.float32)
    token = sampler.sample(logits)
    assert 0 <= token < n and sampler.logprob(logits, token) < 0
    sampler.accept(token)
    sampler.close()
