"""The converted IR is the same model as llama.cpp's: next-token logits within LOGIT_ATOL.

Stated tolerance: max |logit difference| <= 1e-4 with f32 on both sides (OpenVINO f32 inference
and KV precision; llama.cpp type_k = type_v = f32, flash attention off). Measured here ~6e-6.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import openvino as ov

from benchmarks.openvino_mechanism.llama_native import LlamaNative
from kvres.actors.engines.openvino import StateExecutor, convert_gguf_to_ir, load_model, read_llama_gguf
from kvres.actors.engines.openvino.rope import RopeParams, rotate_keys
from kvres.actors.model_files import model_id

from .conftest import write_tiny_llama_gguf

LOGIT_ATOL = 1e-4


def _prompt(n: int, seed: int = 0) -> list[int]:
    rng = np.random.default_rng(seed)
    return [1] + rng.integers(3, 500, n - 1).tolist()


def test_reader_reads_hyper_parameters(stories_gguf: Path) -> None:
    w = read_llama_gguf(stories_gguf)
    c = w.config
    assert (c.n_layers, c.n_embd, c.n_heads, c.n_kv_heads, c.head_dim, c.vocab_size) == (5, 64, 8, 4, 8, 512)
    assert c.rope_freq_base == 10000.0 and abs(c.rms_eps - 1e-5) < 1e-9
    # (n_out, n_in) layout: k projects 64 -> 4 heads x 8 dims
    assert w.tensors["blk.0.attn_k.weight"].shape == (32, 64)


def test_prefill_logits_match_llama_cpp(stories_gguf: Path, llama: LlamaNative) -> None:
    ex = StateExecutor(stories_gguf)
    tokens = _prompt(100)
    ex.open_session("s")
    got = ex.append("s", tokens)
    want = llama.decode(tokens, list(range(100)))
    assert np.abs(got - want).max() <= LOGIT_ATOL
    assert got.argmax() == want.argmax()


def test_greedy_steps_match_llama_cpp(stories_gguf: Path, llama: LlamaNative) -> None:
    ex = StateExecutor(stories_gguf)
    tokens = _prompt(40, seed=3)
    ex.open_session("s")
    got, want = ex.append("s", tokens), llama.decode(tokens, list(range(40)))
    worst = 0.0
    for step in range(20):
        assert got.argmax() == want.argmax(), f"argmax differs at greedy step {step}"
        worst = max(worst, float(np.abs(got - want).max()))
        nxt = int(want.argmax())
        got, want = ex.append("s", [nxt]), llama.decode([nxt], [40 + step])
    assert worst <= LOGIT_ATOL


def test_ir_on_disk_is_the_same_model(stories_gguf: Path, tmp_path: Path) -> None:
    xml = convert_gguf_to_ir(stories_gguf, tmp_path / "ir")
    loaded = load_model(xml)
    assert loaded.model_id == read_llama_gguf(stories_gguf).model_id == model_id(stories_gguf)
    assert loaded.rope == RopeParams(10000.0, 8) and loaded.has_attention_probs
    tokens = _prompt(50, seed=5)
    a, b = StateExecutor(stories_gguf), StateExecutor(xml)
    a.open_session("s")
    b.open_session("s")
    np.testing.assert_array_equal(a.append("s", tokens), b.append("s", tokens))
    assert a.fingerprint == b.fingerprint


def test_tiny_random_gguf_matches_llama_cpp_too(tmp_path: Path) -> None:
    """A second geometry (GQA 4:2, head_dim 8, 2 layers): the converter is not stories-specific."""
    path = write_tiny_llama_gguf(tmp_path / "tiny.gguf", seed=7)
    tokens = list(range(3, 60))
    with LlamaNative(path, n_ctx=128) as native:
        want = native.decode(tokens, list(range(len(tokens))))
    ex = StateExecutor(path)
    ex.open_session("s")
    assert np.abs(ex.append("s", tokens) - want).max() <= LOGIT_ATOL


def test_numpy_rotation_equals_graph_rope(stories_gguf: Path) -> None:
    """Keys are stored after RoPE: rotating them by d in numpy equals computing them at p + d."""
    loaded = load_model(stories_gguf)
    compiled = ov.Core().compile_model(
        loaded.model, "CPU", {"INFERENCE_PRECISION_HINT": "f32", "KV_CACHE_PRECISION": "f32",
                              "INFERENCE_NUM_THREADS": 1})
    tokens = np.asarray([_prompt(30, seed=9)], dtype=np.int64)

    def keys_at(offset: int) -> np.ndarray:
        req = compiled.create_infer_request()
        req.infer({"input_ids": tokens, "attention_mask": np.ones_like(tokens),
                   "position_ids": np.arange(30)[None] + offset, "beam_idx": np.zeros(1, np.int32)})
        states = {s.name: s.state.data.copy() for s in req.query_state()}
        return states[loaded.state_names[0][0]]

    moved = rotate_keys(keys_at(0), 57, loaded.rope)
    np.testing.assert_allclose(moved, keys_at(57), atol=1e-5)
