"""Fixtures of the OpenVINO tests: the shared GGUF, its llama.cpp twin, a second tiny Llama GGUF.

Primitives:
- ``stories_gguf``: ../shared/models/stories260K.gguf (a failure, never a skip, when missing).
- ``llama``: a ``LlamaNative`` (f32 KV, flash attention off) on it, cleared before each use.
- ``other_gguf``: a different, randomly initialised Llama GGUF written with ``gguf.GGUFWriter``.
- ``write_tiny_llama_gguf(path, seed, arch)``: that writer, for tests that need a variant.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from benchmarks.openvino_mechanism.llama_native import LlamaNative
from tests.conftest import shared_model_path

os.environ.setdefault("INFERENCE_NUM_THREADS", "1")


@pytest.fixture(scope="session")
def stories_gguf() -> Path:
    return shared_model_path()


@pytest.fixture(scope="module")
def llama_module(stories_gguf: Path) -> Iterator[LlamaNative]:
    engine = LlamaNative(stories_gguf, n_ctx=1024)
    yield engine
    engine.close()


@pytest.fixture
def llama(llama_module: LlamaNative) -> LlamaNative:
    llama_module.clear()
    return llama_module


def write_tiny_llama_gguf(path: Path, seed: int = 0, arch: str = "llama") -> Path:
    import gguf

    rng = np.random.default_rng(seed)
    n_embd, n_head, n_kv, n_ff, n_layer, vocab = 32, 4, 2, 64, 2, 64
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(n_layer)
    w.add_context_length(256)
    w.add_embedding_length(n_embd)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_kv)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_count(n_embd // n_head)
    w.add_tokenizer_model("llama")
    w.add_token_list([f"t{i}".encode() for i in range(vocab)])
    w.add_token_scores([0.0] * vocab)
    w.add_token_types([1] * vocab)

    def t(name: str, *shape: int) -> None:
        w.add_tensor(name, (rng.standard_normal(shape) * 0.1).astype(np.float32))

    t("token_embd.weight", vocab, n_embd)
    w.add_tensor("output_norm.weight", np.ones(n_embd, dtype=np.float32))
    hd = n_embd // n_head
    for i in range(n_layer):
        p = f"blk.{i}."
        w.add_tensor(p + "attn_norm.weight", np.ones(n_embd, dtype=np.float32))
        w.add_tensor(p + "ffn_norm.weight", np.ones(n_embd, dtype=np.float32))
        t(p + "attn_q.weight", n_embd, n_embd)
        t(p + "attn_k.weight", n_kv * hd, n_embd)
        t(p + "attn_v.weight", n_kv * hd, n_embd)
        t(p + "attn_output.weight", n_embd, n_embd)
        t(p + "ffn_gate.weight", n_ff, n_embd)
        t(p + "ffn_up.weight", n_ff, n_embd)
        t(p + "ffn_down.weight", n_embd, n_ff)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture(scope="module")
def other_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_llama_gguf(tmp_path_factory.mktemp("tiny") / "tiny-llama.gguf", seed=1)
