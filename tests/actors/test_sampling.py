"""The numpy sampler (``kvres.actors.sampling.TokenSampler``) and the executors' default sampler."""

from __future__ import annotations

import numpy as np
import pytest

from kvres.actors.sampling import SamplingParams, TokenSampler, log_softmax_at
from kvres.policy import CapabilityError
from kvres.testing import ReferenceExecutor

LOGITS = np.random.default_rng(0).normal(size=64).astype(np.float32)


def _old_draws(logits: np.ndarray, temperature: float, seed: int, n: int) -> list[int]:
    """The draw TokenSampler has always made: one uniform against the CDF of softmax(logits / T)."""
    rng = np.random.default_rng(seed)
    z = logits.astype(np.float64) / temperature
    z -= z.max()
    cdf = np.cumsum(np.exp(z))
    return [int(min(np.searchsorted(cdf, rng.random() * cdf[-1], side="right"), len(cdf) - 1)) for _ in range(n)]


def test_temperature_and_seed_draw_as_they_always_did() -> None:
    sampler = TokenSampler(0.8, 3)
    assert [sampler.sample(LOGITS) for _ in range(50)] == _old_draws(LOGITS, 0.8, 3, 50)
    params = TokenSampler(params=SamplingParams(temperature=0.8, seed=3, penalty_last_n=0))
    assert [params.sample(LOGITS) for _ in range(50)] == _old_draws(LOGITS, 0.8, 3, 50)
    assert TokenSampler().sample(LOGITS) == int(np.argmax(LOGITS))
    assert (sampler.temperature, sampler.seed) == (0.8, 3)


@pytest.mark.parametrize("filters", [{"top_k": 1}, {"top_p": 1e-6}, {"min_p": 0.999}])
def test_tight_filters_leave_only_the_argmax(filters: dict[str, float]) -> None:
    sampler = TokenSampler(params=SamplingParams(temperature=2.0, seed=1, **filters))
    assert {sampler.sample(LOGITS) for _ in range(30)} == {int(np.argmax(LOGITS))}


def test_filters_keep_what_they_should() -> None:
    top = np.argsort(-LOGITS)
    k3 = TokenSampler(params=SamplingParams(temperature=5.0, seed=2, top_k=3))
    assert {k3.sample(LOGITS) for _ in range(200)} == set(top[:3].tolist())
    probs = np.exp(LOGITS - LOGITS.max())
    probs /= probs.sum()
    kept = set(np.nonzero(probs >= 0.5 * probs.max())[0].tolist())
    min_p = TokenSampler(params=SamplingParams(temperature=5.0, seed=2, min_p=0.5))
    assert {min_p.sample(LOGITS) for _ in range(300)} == kept
    order = np.argsort(-probs)
    nucleus = set(order[: int(np.searchsorted(np.cumsum(probs[order]), 0.5)) + 1].tolist())
    top_p = TokenSampler(params=SamplingParams(temperature=5.0, seed=2, top_p=0.5))
    assert {top_p.sample(LOGITS) for _ in range(300)} == nucleus


def test_penalties_count_the_primed_and_accepted_tokens() -> None:
    logits = np.zeros(8, dtype=np.float32)
    logits[[2, 5]] = [3.0, 2.9]
    sampler = TokenSampler(params=SamplingParams(repeat_penalty=1.2, penalty_last_n=3))
    assert sampler.sample(logits) == 2
    sampler.prime([2])
    assert sampler.sample(logits) == 5
    sampler.accept(0)
    sampler.accept(1)
    sampler.accept(4)  # 2 has left the window of 3
    assert sampler.sample(logits) == 2
    presence = TokenSampler(params=SamplingParams(presence_penalty=0.5))
    presence.prime([2])
    assert presence.sample(logits) == 5


def test_logprob_is_the_log_softmax_of_the_raw_logits() -> None:
    sampler = TokenSampler(params=SamplingParams(temperature=0.5, top_k=2))
    expected = float(LOGITS[7] - np.log(np.exp(LOGITS.astype(np.float64)).sum()))
    assert sampler.logprob(LOGITS, 7) == pytest.approx(expected) == log_softmax_at(LOGITS, 7)
    with pytest.raises(ValueError, match="token 64"):
        log_softmax_at(LOGITS, 64)


def test_grammars_are_refused_by_the_numpy_sampler_and_the_default() -> None:
    with pytest.raises(CapabilityError, match="numpy sampler"):
        TokenSampler(params=SamplingParams(grammar='root ::= "a"'))
    with pytest.raises(CapabilityError, match="reference executor cannot sample with a grammar"):
        ReferenceExecutor().sampler(SamplingParams(json_schema={"type": "integer"}))
    assert isinstance(ReferenceExecutor().sampler(SamplingParams()), TokenSampler)
