"""llama.cpp's own sampler chain on the host's numpy logits (stories260K)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from kvres.actors.engines.llama import LlamaExecutor
from kvres.actors.sampling import Sampler, SamplingParams

from .conftest import story_tokens

SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
    "required": ["name", "age"],
}


def _run(ex: LlamaExecutor, sid: str, prompt: list[int], params: SamplingParams, n: int,
         stop_at_eog: bool = False) -> list[int]:
    """What the host's step loop does: sample from the session's logits, accept, append."""
    ex.open_session(sid)
    logits = ex.append(sid, prompt)
    sampler = ex.sampler(params)
    sampler.prime(prompt)
    out: list[int] = []
    try:
        for _ in range(n):
            token = sampler.sample(logits)
            sampler.accept(token)
            if stop_at_eog and token in ex.end_of_generation():
                break
            out.append(token)
            logits = ex.append(sid, [token])
    finally:
        sampler.close()
    return out


@pytest.fixture
def prompt(llama: LlamaExecutor) -> list[int]:
    return story_tokens(llama, 40)


def test_greedy_and_top_k_one_are_argmax(llama: LlamaExecutor, prompt: list[int]) -> None:
    llama.open_session("ref")
    llama.append("ref", prompt)
    expected = llama.generate("ref", 12, stop_at_eog=False)
    assert _run(llama, "g", prompt, SamplingParams(), 12) == expected
    assert _run(llama, "k", prompt, SamplingParams(temperature=1.5, top_k=1, seed=5), 12) == expected


def test_a_fixed_seed_reproduces_and_another_differs(llama: LlamaExecutor, prompt: list[int]) -> None:
    params = SamplingParams(temperature=1.0, top_p=0.95, min_p=0.02, seed=11)
    a = _run(llama, "a", prompt, params, 24)
    b = _run(llama, "b", prompt, params, 24)
    c = _run(llama, "c", prompt, params.model_copy(update={"seed": 12}), 24)
    assert a == b and a != c


def test_penalties_change_the_choices(llama: LlamaExecutor, prompt: list[int]) -> None:
    plain = _run(llama, "p", prompt, SamplingParams(), 40)
    penalized = _run(llama, "q", prompt, SamplingParams(repeat_penalty=1.8, frequency_penalty=0.5,
                                                        presence_penalty=0.5), 40)
    assert plain != penalized
    assert len(set(penalized)) > len(set(plain))  # fewer repeats


def test_prime_feeds_the_penalties_the_log(llama: LlamaExecutor) -> None:
    """The penalties see the primed tokens: a token the log repeats loses to one it never had."""
    logits = np.zeros(llama.n_vocab, dtype=np.float32)
    logits[[7, 9]] = 5.0
    logits[7] += 0.01
    sampler = llama.sampler(SamplingParams(repeat_penalty=1.5, penalty_last_n=4))
    assert sampler.sample(logits) == 7
    sampler.prime([3, 7, 7])
    assert sampler.sample(logits) == 9
    sampler.prime([3, 4, 5, 6, 8])  # 7 left the window
    assert sampler.sample(logits) == 7
    assert sampler.logprob(logits, 7) == pytest.approx(float(logits[7] - np.log(np.exp(logits).sum())), abs=1e-5)


def test_a_json_schema_constrained_generation_parses(llama: LlamaExecutor) -> None:
    prompt = llama.tokenize("Once upon a time")
    for i, (temperature, seed) in enumerate([(0.0, None), (0.8, 1), (1.2, 2)]):
        tokens = _run(llama, f"j{i}", prompt, SamplingParams(json_schema=SCHEMA, temperature=temperature, seed=seed),
                      400, stop_at_eog=True)
        value = json.loads(llama.detokenize(tokens))
        assert set(value) == {"name", "age"}
        assert isinstance(value["name"], str) and isinstance(value["age"], int)


def test_a_gbnf_grammar_is_followed(llama: LlamaExecutor, prompt: list[int]) -> None:
    tokens = _run(llama, "g", prompt, SamplingParams(grammar='root ::= ("yes" | "no") "."', temperature=1.0, seed=3),
                  20, stop_at_eog=True)
    assert llama.detokenize(tokens).strip() in ("yes.", "no.")


def test_greedy_under_a_grammar_chooses_what_the_whole_chain_chooses(llama: LlamaExecutor) -> None:
    """The argmax is taken when the grammar allows it, else the grammar runs over every token:
    either way the same token as the chain over the whole vocabulary (ties included)."""
    grammar = 'root ::= [a-z ]+'
    fast = llama.sampler(SamplingParams(grammar=grammar))
    whole = llama.sampler(SamplingParams(grammar=grammar))
    whole._argmax_first = False  # type: ignore[attr-defined]  # the reference: the chain alone
    rng = np.random.default_rng(3)
    took_argmax = 0
    try:
        for step in range(200):
            logits = rng.standard_normal(llama.n_vocab).astype(np.float32)
            if step % 5 == 0:
                logits[rng.integers(llama.n_vocab, size=3)] = logits.max()  # ties
            token = fast.sample(logits)
            assert token == whole.sample(logits), step
            took_argmax += token == int(np.argmax(logits))
            fast.accept(token)
            whole.accept(token)
    finally:
        fast.close()
        whole.close()
    assert 0 < took_argmax < 200  # both ways were taken


def test_plain_greedy_takes_the_argmax_the_chain_would(llama: LlamaExecutor) -> None:
    """Greedy with nothing else is numpy's argmax, not the chain's candidate array: the same token
    as the chain (the first of equal maxima, -inf logits, all of them -inf)."""
    fast = llama.sampler(SamplingParams())
    whole = llama.sampler(SamplingParams())
    whole._argmax_only = False  # type: ignore[attr-defined]  # the reference: the chain alone
    rng = np.random.default_rng(4)
    try:
        for step in range(100):
            logits = rng.standard_normal(llama.n_vocab).astype(np.float32)
            if step % 3 == 0:
                logits[rng.integers(llama.n_vocab, size=4)] = logits.max()  # ties
            if step % 5 == 0:
                logits[: llama.n_vocab // 2] = -np.inf
            assert fast.sample(logits) == whole.sample(logits), step
        blocked = np.full(llama.n_vocab, -np.inf, dtype=np.float32)
        assert fast.sample(blocked) == whole.sample(blocked)  # nothing finite: the chain decides
    finally:
        fast.close()
        whole.close()


def test_bad_grammars_and_tokens_are_refused_without_a_crash(llama: LlamaExecutor) -> None:
    with pytest.raises(ValueError, match=r"not valid GBNF: .*expecting '\)'"):
        llama.sampler(SamplingParams(grammar="root ::= foo bar("))
    with pytest.raises(ValueError, match="not valid GBNF: .*Undefined rule identifier 'nothing'"):
        llama.sampler(SamplingParams(grammar="root ::= nothing"))
    with pytest.raises(ValueError, match="json_schema"):
        llama.sampler(SamplingParams(json_schema={"type": "object", "properties": {"a": {"$ref": "#/nowhere"}}}))
    sampler = llama.sampler(SamplingParams(grammar='root ::= "yes"'))
    no = llama.tokenize("no", add_bos=False)[0]
    with pytest.raises(ValueError, match=f"token {no} is not allowed by the grammar"):
        sampler.accept(no)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        sampler.accept(llama.n_vocab)
    with pytest.raises(ValueError, match="token 2 is not allowed"):
        sampler.accept(2)  # end of generation before the grammar is complete: llama.cpp would abort
    with pytest.raises(ValueError, match="512 logits"):
        sampler.sample(np.zeros(10, dtype=np.float32))
    sampler.close()
    with pytest.raises(ValueError, match="closed"):
        sampler.sample(np.zeros(llama.n_vocab, dtype=np.float32))


def test_the_sampled_token_is_not_asked_of_the_grammar_twice(llama: LlamaExecutor) -> None:
    """accept() of the token sample() chose under the grammar does not ask the grammar again (one
    llama.cpp call a token saved); any other token still is, and one the grammar refuses fails."""
    sampler = llama.sampler(SamplingParams(grammar='root ::= "yes"'))
    asked: list[int] = []
    allows = sampler._allows
    sampler._allows = lambda token: asked.append(token) or allows(token)  # type: ignore[method-assign]
    no = llama.tokenize("no", add_bos=False)[0]
    logits = np.zeros(llama.n_vocab, dtype=np.float32)
    logits[no] = 10.0  # the argmax, which the grammar refuses
    token = sampler.sample(logits)
    assert token != no and asked == [no]
    with pytest.raises(ValueError, match=f"token {no} is not allowed by the grammar"):
        sampler.accept(no)  # not the sampled token: asked, and refused
    assert asked == [no, no]
    token = sampler.sample(logits)
    sampler.accept(token)  # the sampled one: taken without a second question
    assert asked == [no, no, no]
    sampler.close()


def test_many_samplers_come_and_go(llama: LlamaExecutor) -> None:
    """Chains are freed on close or when dropped (a leak would show as growing memory; this only
    checks that creating and freeing many does not fail)."""
    logits = np.linspace(0, 1, llama.n_vocab, dtype=np.float32)
    for i in range(300):
        sampler: Sampler = llama.sampler(SamplingParams(temperature=0.7, seed=i, top_k=40, repeat_penalty=1.1,
                                                        grammar='root ::= [a-z]+' if i % 2 else None))
        assert 0 <= sampler.sample(logits) < llama.n_vocab
        if i % 3:
            sampler.close()


@pytest.mark.parametrize(("field", "value"), [
    ("temperature", -0.1), ("temperature", float("nan")), ("seed", -1), ("seed", 2**32 - 1), ("seed", 1.5),
    ("top_k", -1), ("top_p", 0.0), ("top_p", 1.1), ("min_p", 1.0), ("min_p", -0.1), ("repeat_penalty", 0.0),
    ("frequency_penalty", float("inf")), ("presence_penalty", float("nan")), ("penalty_last_n", -2),
    ("grammar", " "), ("logprobs", "yes"),
])
def test_bad_params_are_named(field: str, value: Any) -> None:
    with pytest.raises(ValueError, match=field):
        SamplingParams(**{field: value})


def test_grammar_and_schema_together_are_refused() -> None:
    with pytest.raises(ValueError, match="grammar and json_schema"):
        SamplingParams(grammar='root ::= "a"', json_schema=SCHEMA)
    with pytest.raises(ValueError, match="unknown_field|extra"):
        SamplingParams(unknown_field=1)  # type: ignore[call-arg]


def test_the_numpy_sampler_still_draws_as_before(make_llama: Callable[..., LlamaExecutor]) -> None:
    """``TokenSampler`` with only (temperature, seed) makes exactly the draws it always made: the
    executor's own generate (which uses it) against a hand-written CDF draw."""
    ex = make_llama()
    ex.open_session("s")
    logits = ex.append("s", story_tokens(ex, 20))
    rng = np.random.default_rng(4)
    z = logits.astype(np.float64) / 0.7
    z -= z.max()
    cdf = np.cumsum(np.exp(z))
    expected = int(min(np.searchsorted(cdf, rng.random() * cdf[-1], side="right"), len(cdf) - 1))
    assert ex.generate("s", 1, temperature=0.7, seed=4, stop_at_eog=False) == [expected]
