"""Scorer objects on synthetic captures: what each keeps, and typed refusals."""

from __future__ import annotations

import numpy as np
import pytest

from kvres.policy import Range
from kvres.policy.scorers import H2O, KeyCapture, KeyNorm, SnapKV, scorer_for
from kvres.policy.scoring import AttentionCapture


def _capture(rows: list[list[float]]) -> AttentionCapture:
    probs = np.asarray(rows, dtype=np.float32)[None, None]  # one layer, one head
    keys = np.arange(probs.shape[-1], dtype=np.int64)
    return AttentionCapture(probs, keys, keys[-probs.shape[2]:])


def test_snapkv_counts_only_the_observation_window_and_pools_neighbours() -> None:
    cap = _capture([[0.0, 0.0, 1.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0, 0.5, 0.5]])
    np.testing.assert_allclose(SnapKV(window=1, kernel=1).score(cap), [0, 0, 0, 0, 0.5, 0.5])
    pooled = SnapKV(window=2, kernel=3).score(cap)
    np.testing.assert_allclose(pooled, [0, 1, 1, 1, 0.5, 0.5])  # key 2's neighbours share its peak
    assert SnapKV(2, 1).block_scores(cap, [Range(0, 3), Range(3, 6)]) == pytest.approx([1.0, 1.0])


def test_h2o_sums_every_row() -> None:
    cap = _capture([[1.0, 0.0, 0.0], [0.5, 0.5, 0.0], [0.2, 0.3, 0.5]])
    np.testing.assert_allclose(H2O().score(cap), [1.7, 0.8, 0.5])


def test_keynorm_prefers_small_keys() -> None:
    keys = np.zeros((2, 1, 3, 2), dtype=np.float32)
    keys[:, :, 0] = [3.0, 4.0]  # norm 5
    keys[:, :, 1] = [0.6, 0.8]  # norm 1
    keys[:, :, 2] = [0.0, 2.0]  # norm 2
    cap = KeyCapture(keys, np.array([10, 11, 12]))
    np.testing.assert_allclose(KeyNorm().score(cap), [-5.0, -1.0, -2.0], rtol=1e-6)
    assert KeyNorm().block_scores(cap, [Range(10, 11), Range(11, 13)]) == pytest.approx([-5.0, -3.0])


def test_inputs_and_names_are_checked() -> None:
    with pytest.raises(TypeError, match="KeyNorm scores a key capture"):
        KeyNorm().score(_capture([[1.0]]))
    with pytest.raises(TypeError, match="attention capture"):
        SnapKV().score(KeyCapture(np.zeros((1, 1, 1, 2), dtype=np.float32), np.array([0])))
    with pytest.raises(ValueError, match="kernel must be odd"):
        SnapKV(kernel=4)
    with pytest.raises(ValueError, match="unknown scorer 'x'"):
        scorer_for("x", 8)
    with pytest.raises(ValueError, match="one position per key"):
        KeyCapture(np.zeros((1, 1, 2, 2), dtype=np.float32), np.array([0]))
    assert scorer_for("snapkv", 10) == SnapKV(10) and scorer_for("keynorm", 10).needs == "keys"
