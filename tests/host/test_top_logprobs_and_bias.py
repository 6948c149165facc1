"""A generate's ``top_logprobs`` are the log-softmax of the engine's logits of each step (checked
against llama-cpp-python's own ``Llama`` evaluating the same tokens), and ``logit_bias`` moves
the sampler's choice. Real llama.cpp on stories260K through a ``BackendHost``."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pydantic
import pytest

from kvres.actors.config import BackendConfig
from kvres.actors.generation import GenerationRequest
from kvres.actors.host.backend import BackendHost
from kvres.actors.sampling import SamplingParams, TokenSampler
from kvres.policy.tokens import TokenIdError
from tests.conftest import local_host, shared_model_path

PROMPT = [1, *(3 + (7 * i) % 200 for i in range(30))]


def _host(tmp_path: Path) -> BackendHost:
    config = BackendConfig(name="toplp", model_path=shared_model_path(), n_ctx=512, n_seq_max=2,
                           kv_budget_tokens=500, n_threads=1)
    host: BackendHost = local_host(config, None)
    return host


def _generate(host: BackendHost, sid: str, **sampling: object) -> list[int]:
    host.open_session(sid)
    host.append(sid, PROMPT)
    reply = host.generate(sid, GenerationRequest(max_tokens=6, ignore_eos=True, sampling=SamplingParams(**sampling)))
    host.close(sid)
    return list(reply)


def test_top_logprobs_are_the_engines_log_softmax(tmp_path: Path) -> None:
    from llama_cpp import Llama

    host = _host(tmp_path)
    host.open_session("s")
    host.append("s", PROMPT)
    reply = host.generate("s", GenerationRequest(max_tokens=6, ignore_eos=True,
                                                 sampling=SamplingParams(top_logprobs=5)))
    assert reply.top_logprobs is not None and len(reply.top_logprobs) == 6
    assert reply.logprobs is not None and len(reply.logprobs) == 6  # top_logprobs implies the chosen ones

    llm = Llama(str(shared_model_path()), n_ctx=512, logits_all=True, n_threads=1, verbose=False)
    tokens = [*PROMPT, *reply]
    llm.eval(tokens)
    for step, (alternatives, chosen) in enumerate(zip(reply.top_logprobs, reply.logprobs, strict=True)):
        logits = np.asarray(llm.scores[len(PROMPT) - 1 + step], dtype=np.float64)
        expected = logits - logits.max() - np.log(np.exp(logits - logits.max()).sum())
        assert len(alternatives) == 5
        listed = [t for t, _ in alternatives]
        # batched float32 against one sequence's: each within 1e-2, and near ties in either order
        assert [lp for _, lp in alternatives] == pytest.approx([float(expected[t]) for t in listed], abs=1e-2)
        assert [lp for _, lp in alternatives] == sorted((lp for _, lp in alternatives), reverse=True)
        left_out = np.delete(expected, listed)
        assert left_out.max() <= min(lp for _, lp in alternatives) + 1e-2
        assert alternatives[0][0] == reply[step]  # greedy: the chosen token is the most likely one
        assert chosen == pytest.approx(alternatives[0][1], abs=1e-6)


def test_logit_bias_moves_the_choice(tmp_path: Path) -> None:
    host = _host(tmp_path)
    greedy = _generate(host, "plain")
    forced = next(t for t in range(100, 400) if t not in greedy)
    assert _generate(host, "up", logit_bias={forced: 100.0}) == [forced] * 6
    banned = _generate(host, "down", logit_bias={greedy[0]: -100.0})
    assert greedy[0] not in banned
    # the numpy sampler and llama.cpp's chain agree on it, sampled too
    sampled = _generate(host, "sampled", temperature=1.0, seed=3, logit_bias={forced: 100.0})
    assert sampled == [forced] * 6


@pytest.mark.parametrize("field,value,says", [
    ("top_logprobs", 21, r"top_logprobs must be in \[0, 20\]"), ("top_logprobs", -1, r"top_logprobs must be in"),
    ("logit_bias", {5: 100.5}, r"logit_bias\[5\] must be in \[-100, 100\]"),
    ("logit_bias", {5: float("nan")}, r"logit_bias\[5\] must be in"),
    ("logit_bias", {-2: 1.0}, r"logit_bias: token id -2 must be >= 0")])
def test_bad_values_are_named(field: str, value: object, says: str) -> None:
    with pytest.raises(pydantic.ValidationError, match=says):
        SamplingParams(**{field: value})  # type: ignore[arg-type]


def test_a_bias_outside_the_vocabulary_names_the_token(tmp_path: Path) -> None:
    host = _host(tmp_path)
    host.open_session("far")
    host.append("far", PROMPT)
    request = GenerationRequest(max_tokens=2, sampling=SamplingParams(logit_bias={99999: 1.0}))
    with pytest.raises(TokenIdError, match=r"logit_bias: token id 99999 is outside the vocabulary \[0, 512\)"):
        host.generate("far", request)
    assert host.tokens("far") == PROMPT  # refused before anything ran
    with pytest.raises(TokenIdError, match="99999"):
        TokenSampler(params=SamplingParams(logit_bias={99999: 1.0})).sample(np.zeros(512))
