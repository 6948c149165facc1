"""Attention scores from the scoring pass: one per range, the right mass, the right keys."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from kvres.actors.engines.openvino import StateExecutor, load_model, openvino_executor
from kvres.actors.engines.openvino.scoring_pass import with_attention_outputs
from kvres.policy import CapabilityError, Range, RangeError
from kvres.policy.capabilities import Capabilities
from kvres.policy.scorers import SnapKV

PROMPT = [1] + [3 + (i * 13) % 300 for i in range(119)]


def test_scores_cover_the_observation_window_mass(stories_gguf: Path) -> None:
    ex = StateExecutor(stories_gguf, score_window=8, score_kernel=1)
    ex.open_session("s")
    ex.append("s", PROMPT)
    ranges = [Range(0, 40), Range(40, 80), Range(80, 120)]
    scores = SnapKV(8, kernel=1).block_scores(ex.attention("s", 8), ranges)
    # every query row of every head of every layer sums to 1 over the keys it sees
    assert sum(scores) == pytest.approx(5 * 8 * 8, rel=1e-5)
    assert all(s > 0 for s in scores)
    # the pass does not disturb the session: same next token as an unscored twin
    twin = StateExecutor(stories_gguf, score_window=8)
    twin.open_session("s")
    twin.append("s", PROMPT)
    np.testing.assert_array_equal(ex.append("s", [5]), twin.append("s", [5]))


@pytest.mark.parametrize("mode", ["state", "recompute"])
def test_scores_only_count_resident_keys(stories_gguf: Path, mode: str) -> None:
    # no pooling: the mass of the resident keys adds up
    ex = openvino_executor(stories_gguf, mode=mode, score_window=4, score_kernel=1)
    ex.open_session("s")
    ex.append("s", PROMPT)
    ex.evict_range("s", Range(20, 100), rebase=True)
    scores = SnapKV(4, kernel=1).block_scores(ex.attention("s", 4), [Range(0, 20), Range(100, 120)])
    assert sum(scores) == pytest.approx(5 * 8 * 4, rel=1e-5)


@pytest.mark.parametrize("mode", ["state", "recompute"])
def test_attention_capture_is_labelled_by_token_log_index(stories_gguf: Path, mode: str) -> None:
    ex = openvino_executor(stories_gguf, mode=mode, score_kernel=1)
    assert ex.capabilities().attention_capture
    ex.open_session("s")
    with pytest.raises(RangeError, match="no resident tokens"):
        ex.attention("s")
    ex.append("s", PROMPT)
    ex.evict_range("s", Range(20, 100), rebase=True)
    cap = ex.attention("s", window=6)
    keys = np.r_[0:20, 100:120]
    assert cap.probs.shape == (5, 8, 6, 40) and cap.probs.dtype == np.float32
    np.testing.assert_array_equal(cap.key_positions, keys)
    np.testing.assert_array_equal(cap.query_positions, keys[-6:])
    np.testing.assert_allclose(cap.probs.sum(axis=-1), 1.0, atol=1e-5)
    later = cap.key_positions[None, :] > cap.query_positions[:, None]
    assert np.all(cap.probs[:, :, later] == 0)  # causal
    scores = SnapKV(6, kernel=1).block_scores(cap, [Range(0, 20), Range(100, 120)])
    np.testing.assert_allclose(scores, [cap.probs[..., :20].sum(), cap.probs[..., 20:].sum()], rtol=1e-6)


def test_sdpa_graph_has_no_scores(stories_gguf: Path) -> None:
    from kvres.actors.engines.openvino import build_llama_model, read_llama_gguf

    model = build_llama_model(read_llama_gguf(stories_gguf), attention="sdpa")
    with pytest.raises(CapabilityError, match="no explicit attention"):
        with_attention_outputs(model)
    assert load_model(stories_gguf).has_attention_probs
    assert isinstance(StateExecutor(stories_gguf).capabilities(), Capabilities)


def test_sdpa_ir_runs_but_says_it_cannot_score(stories_gguf: Path, tmp_path: Path) -> None:
    """Where no attention is exposed, capabilities say so and scoring is refused (the planner then
    falls back to recency); the model itself is the same."""
    from kvres.actors.engines.openvino import convert_gguf_to_ir

    xml = convert_gguf_to_ir(stories_gguf, tmp_path / "sdpa", attention="sdpa")
    sdpa, explicit = StateExecutor(xml), StateExecutor(stories_gguf)
    assert not sdpa.capabilities().attention_capture and explicit.capabilities().attention_capture
    for e in (sdpa, explicit):
        e.open_session("s")
    np.testing.assert_allclose(sdpa.append("s", PROMPT), explicit.append("s", PROMPT), atol=1e-4)
    assert not sdpa.capabilities().attention_capture
    with pytest.raises(CapabilityError, match="exposes no attention"):
        sdpa.attention("s")


def test_scores_agree_with_llama_cpp_on_the_same_prompt(stories_gguf: Path) -> None:
    """One policy keeps the same blocks on either engine: both pool and sum the same way."""
    from kvres.actors.engines.llama import LlamaExecutor

    ranges = [Range(i, i + 8) for i in range(0, 120, 8)]
    ov_ex = StateExecutor(stories_gguf, score_window=8)
    ov_ex.open_session("s")
    ov_ex.append("s", PROMPT)
    ll_ex = LlamaExecutor(stories_gguf, n_ctx=256, n_seq_max=1, n_threads=1, type_k="f32", type_v="f32",
                          flash_attn=False)
    ll_ex.open_session("s")
    ll_ex.append("s", PROMPT)
    ov_scores = np.array(SnapKV(8).block_scores(ov_ex.attention("s", 8), ranges))
    ll_scores = np.array(SnapKV(8).block_scores(ll_ex.attention("s", 8), ranges))
    # llama.cpp scores in its f16 scoring context: ~0.2% apart from OpenVINO f32
    np.testing.assert_allclose(ov_scores, ll_scores, rtol=5e-3)
    assert list(np.argsort(ov_scores)) == list(np.argsort(ll_scores))


def test_keys_agree_between_engines(stories_gguf: Path) -> None:
    """The attention-free scorer reads the same post-RoPE keys from either engine."""
    from kvres.actors.engines.llama import LlamaExecutor

    ov_ex = StateExecutor(stories_gguf)
    ll_ex = LlamaExecutor(stories_gguf, n_ctx=256, n_seq_max=1, n_threads=1, type_k="f32", type_v="f32",
                          flash_attn=False)
    for ex in (ov_ex, ll_ex):
        ex.open_session("s")
        ex.append("s", PROMPT)
        ex.evict_range("s", Range(20, 100), rebase=False)
    ov_keys, ll_keys = ov_ex.keys("s"), ll_ex.keys("s")
    order = np.argsort(ll_keys.key_positions)
    np.testing.assert_array_equal(ov_keys.key_positions, np.r_[0:20, 100:120])
    np.testing.assert_array_equal(ll_keys.key_positions[order], ov_keys.key_positions)
    np.testing.assert_allclose(ll_keys.keys[:, :, order], ov_keys.keys, atol=1e-4)
    assert ov_ex.capabilities().key_access and ll_ex.capabilities().key_access
