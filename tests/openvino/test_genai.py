"""The openvino-genai mode: the exported folder loads in genai's pipelines and is the same model.

Greedy continuations are compared token for token with llama.cpp (f32 on both sides); the
tokenizer built from the GGUF vocabulary must tokenize exactly as llama.cpp does.
"""

from __future__ import annotations

from pathlib import Path

import openvino_genai as genai
import pytest

from benchmarks.openvino_mechanism.llama_native import LlamaNative, NativeSession
from kvres.actors.engines.openvino.genai import EngineEviction, GenAIEngine, export_genai_model
from kvres.policy import ContextLengthError, StreamPolicy

TEXTS = [
    "Once upon a time, there was a little girl named Lily. She liked to play outside!",
    "Tom and  Sue saw a big dog.\nThe dog was happy: 123 bones, éclair?",
]
PROMPT = [1] + [3 + (i * 37) % 490 for i in range(60)]
LONG_PROMPT = [1] + [3 + (i * 37) % 490 for i in range(400)]


@pytest.fixture(scope="module")
def genai_dir(stories_gguf: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return export_genai_model(stories_gguf, tmp_path_factory.mktemp("genai") / "stories260K")


def _llama_greedy(llama: LlamaNative, prompt: list[int], n: int) -> list[int]:
    session = NativeSession(llama)
    logits, out = session.append(prompt), []
    for _ in range(n):
        out.append(int(logits.argmax()))
        logits = session.append([out[-1]])
    return out


def test_tokenizer_matches_llama_cpp(genai_dir: Path, llama: LlamaNative) -> None:
    tok = genai.Tokenizer(str(genai_dir))
    for text in TEXTS:
        ids = tok.encode(text).input_ids.data[0].tolist()
        assert ids == llama.tokenize(text)
        assert tok.decode(ids) == text


def test_continuous_batching_greedy_equals_llama_cpp(genai_dir: Path, llama: LlamaNative) -> None:
    engine = GenAIEngine(genai_dir)
    assert engine.generate([PROMPT], 12) == [_llama_greedy(llama, PROMPT, 12)]


def test_llm_pipeline_loads_the_folder(genai_dir: Path, llama: LlamaNative) -> None:
    pipe = genai.LLMPipeline(str(genai_dir), "CPU", INFERENCE_PRECISION_HINT="f32",
                             KV_CACHE_PRECISION="f32", INFERENCE_NUM_THREADS=1)
    text = pipe.generate(TEXTS[0][:16], max_new_tokens=10, do_sample=False)
    ids = llama.tokenize(TEXTS[0][:16])
    expected = genai.Tokenizer(str(genai_dir)).decode(_llama_greedy(llama, ids, 10))
    assert str(text) == expected


def test_engine_eviction_is_active_on_long_prompts(genai_dir: Path) -> None:
    policy = EngineEviction.from_stream_policy(StreamPolicy(True, sink_tokens=4, recent_tokens=32), 96)
    assert (policy.start_size, policy.recent_size, policy.max_cache_size) == (32, 32, 96)
    full, evicting = GenAIEngine(genai_dir), GenAIEngine(genai_dir, eviction=policy)
    assert evicting.generate([PROMPT], 8) == full.generate([PROMPT], 8)  # fits: nothing evicted
    assert evicting.generate([LONG_PROMPT], 12) != full.generate([LONG_PROMPT], 12)
    summed = GenAIEngine(genai_dir, eviction=EngineEviction(32, 32, 96, aggregation="SUM"))
    assert len(summed.generate([LONG_PROMPT], 12)[0]) == 12


def test_engine_eviction_rejects_bad_sizes() -> None:
    with pytest.raises(ValueError, match="recent_size must be a positive multiple of 32, got 40"):
        EngineEviction(32, 40, 128)
    with pytest.raises(ValueError, match="max_cache_size 64 must exceed"):
        EngineEviction(32, 32, 64)
    with pytest.raises(ValueError, match="'MAX'"):
        EngineEviction(32, 32, 128, aggregation="MAX")


def test_executor_tokenizes_like_llama_cpp(stories_gguf: Path, genai_dir: Path, llama: LlamaNative) -> None:
    from kvres.actors.engines.openvino import StateExecutor

    for source in (stories_gguf, genai_dir / "openvino_model.xml"):
        ex = StateExecutor(source)
        for text in TEXTS:
            ids = ex.tokenize(text)
            assert ids == llama.tokenize(text)
            assert ex.tokenize(text, add_bos=False) == ids[1:]
            assert ex.detokenize(ids[1:]) == text


def test_executor_keeps_within_its_kv_pool(stories_gguf: Path, tmp_path: Path) -> None:
    """genai answers a prompt longer than its KV pool with no tokens and no error: the executor
    stops a generation where the log fills the pool, and refuses a log past it."""
    from kvres.actors.engines.openvino.genai_executor import GenAIExecutor

    ex = GenAIExecutor(stories_gguf, work_dir=tmp_path, kv_blocks=8)
    assert ex.session_cells() == 256
    ex.open_session("s", LONG_PROMPT[:250])
    tokens = ex.generate("s", 20)
    assert len(tokens) == 6 and len(ex.token_log("s")) == 256
    assert ex.generate("s", 5) == []
    ex.append("s", [5])
    with pytest.raises(ContextLengthError, match=r"session 's' holds 257 tokens, past the 256 cells of the "
                                                 r"openvino-genai KV pool \(8 blocks of 32\)"):
        ex.generate("s", 5)
    assert len(ex.token_log("s")) == 257
