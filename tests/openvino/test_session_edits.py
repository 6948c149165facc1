"""Truncation, forks, control tokens and sampling on the OpenVINO executor, both mechanisms
(stories260K), and what the openvino-genai executor offers of them."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from kvres.actors.engines.llama import LlamaExecutor
from kvres.actors.engines.openvino import OpenVINOExecutor, openvino_executor
from kvres.actors.sampling import SamplingParams, TokenSampler
from kvres.policy import CapabilityError, Range, RangeError, SessionExistsError
from kvres.policy.tokens import TokenIdError
from tests.llama.chat_gguf import write_chat_model

PROMPT = [1] + [3 + (i * 29) % 450 for i in range(119)]
NEXT = 13
MODES = ["state", "recompute"]
TOL = 1e-4  # float32 engine; the same tokens at the same positions, batched differently


def _ex(stories_gguf: Path, mode: str) -> OpenVINOExecutor:
    return openvino_executor(stories_gguf, mode=mode)


@pytest.mark.parametrize("mode", MODES)
def test_truncate_then_append_equals_a_twin(stories_gguf: Path, mode: str) -> None:
    ex = _ex(stories_gguf, mode)
    ex.open_session("s")
    ex.append("s", PROMPT[:80])
    expected_last = ex.append("s", PROMPT[80:100])
    ex.append("s", PROMPT[100:])
    logits = ex.truncate("s", 100)
    assert ex.token_log("s") == PROMPT[:100] and ex.resident_ranges("s") == [Range(0, 100)]
    assert logits is not None and np.max(np.abs(logits - expected_last)) < TOL
    twin = _ex(stories_gguf, mode)
    twin.open_session("s")
    twin.append("s", PROMPT[:100])
    np.testing.assert_allclose(ex.append("s", [NEXT]), twin.append("s", [NEXT]), atol=TOL)
    assert ex.cache_positions("s").tolist() == twin.cache_positions("s").tolist()


@pytest.mark.parametrize("mode", MODES)
def test_truncate_with_evictions_past_and_before_the_cut(stories_gguf: Path, mode: str) -> None:
    ex = _ex(stories_gguf, mode)
    ex.open_session("s")
    ex.append("s", PROMPT)
    ex.evict_range("s", Range(10, 30), rebase=True)
    ex.evict_range("s", Range(90, 100))
    assert ex.truncate("s", 95) is None  # the last kept token is evicted
    assert ex.resident_ranges("s") == [Range(0, 10), Range(30, 90)]
    twin = _ex(stories_gguf, mode)
    twin.open_session("s")
    twin.append("s", PROMPT[:95])
    twin.evict_range("s", Range(10, 30), rebase=True)
    twin.evict_range("s", Range(90, 95))
    assert ex.cache_positions("s").tolist() == twin.cache_positions("s").tolist()
    np.testing.assert_allclose(ex.append("s", [NEXT]), twin.append("s", [NEXT]), atol=TOL)
    with pytest.raises(RangeError, match="length=97"):
        ex.truncate("s", 97)
    assert ex.truncate("s", 0) is None and ex.token_log("s") == []
    assert ex.append("s", PROMPT[:5]).shape == (ex.n_vocab,)


@pytest.mark.parametrize("mode", MODES)
def test_a_fork_is_independent(stories_gguf: Path, mode: str) -> None:
    ex = _ex(stories_gguf, mode)
    ex.open_session("s")
    ex.append("s", PROMPT)
    expected = ex.append("s", [NEXT])
    ex.fork_session("s", "f")
    with pytest.raises(SessionExistsError):
        ex.fork_session("s", "f")
    ex.evict_range("f", Range(10, 60), rebase=True)
    ex.append("f", [7, 8])
    ex.truncate("s", len(PROMPT))
    np.testing.assert_allclose(ex.append("s", [NEXT]), expected, atol=TOL)
    assert ex.token_log("f") == PROMPT + [NEXT, 7, 8]
    assert ex.resident_ranges("f") == [Range(0, 10), Range(60, len(PROMPT) + 3)]


@pytest.mark.parametrize("mode", MODES)
def test_token_facts_and_sampling(stories_gguf: Path, mode: str) -> None:
    ex = _ex(stories_gguf, mode)
    assert ex.n_vocab == 512 and ex.end_of_generation() == frozenset({2}) and ex.chat_template() is None
    with pytest.raises(TokenIdError, match=r"= 512 is outside the vocabulary \[0, 512\)"):
        ex.detokenize([1, 512])
    with pytest.raises(CapabilityError, match="openvino executor cannot sample with a grammar"):
        ex.sampler(SamplingParams(grammar='root ::= "a"'))
    sampler = ex.sampler(SamplingParams(temperature=0.8, top_k=20, seed=1))
    assert isinstance(sampler, TokenSampler)
    ex.open_session("s")
    assert 0 <= sampler.sample(ex.append("s", PROMPT[:20])) < ex.n_vocab


def test_control_tokens_render_and_parse_as_llama_cpp_does(tmp_path: Path) -> None:
    model = write_chat_model(tmp_path / "chat.gguf")
    ov = openvino_executor(model)
    llama = LlamaExecutor(model, n_ctx=256, n_seq_max=1, n_threads=1)
    try:
        text = "<|system|>\nbe nice</s>\n<|user|>\nhello world</s>\n<|assistant|>\n"
        for special in (False, True):
            ids = llama.tokenize(text, special=special)
            assert ov.tokenize(text, special=special) == ids
            assert ov.detokenize(ids, special=True) == llama.detokenize(ids, special=True)
        assert ov.chat_template() == llama.chat_template()
        assert ov.end_of_generation() == frozenset({2})
    finally:
        llama.close()


def test_genai_executor_edits_its_log(stories_gguf: Path, tmp_path: Path) -> None:
    from kvres.actors.engines.openvino.genai_executor import GenAIExecutor

    ex = GenAIExecutor(stories_gguf, work_dir=tmp_path)
    ex.open_session("s")
    ex.append("s", PROMPT[:10])
    assert ex.truncate("s", 4) is None and ex.token_log("s") == PROMPT[:4]
    with pytest.raises(RangeError, match="length=5"):
        ex.truncate("s", 5)
    ex.fork_session("s", "f")
    ex.append("f", [7])
    assert ex.token_log("s") == PROMPT[:4] and ex.token_log("f") == PROMPT[:4] + [7]
    assert ex.n_vocab == 512 and ex.end_of_generation() == frozenset({2})
    with pytest.raises(TokenIdError):
        ex.detokenize([600])
    with pytest.raises(CapabilityError, match="openvino-genai"):
        ex.sampler(SamplingParams())
