"""Score aggregation on synthetic attention."""

from __future__ import annotations

import numpy as np
import pytest

from kvres.policy import Range
from kvres.policy.scoring import H2OAccumulator, block_scores, pool_1d, snapkv_key_scores


def softmax_rows(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def test_h2o_accumulates_over_steps_and_positions() -> None:
    acc = H2OAccumulator()
    acc.add(np.array([[[0.5, 0.5, 0.0]]]))  # (head, query, key)
    acc.add(np.array([[[0.2, 0.0, 0.8]]]), key_positions=[0, -1, 5])
    np.testing.assert_allclose(acc.scores, [0.7, 0.5, 0, 0, 0, 0.8])
    with pytest.raises(ValueError, match="key_positions"):
        acc.add(np.ones((1, 1, 3)), key_positions=[0, 1])


def test_snapkv_uses_only_the_observation_window_and_pools() -> None:
    n_key = 40
    logits = np.zeros((2, 4, 10, n_key))  # layers, heads, queries, keys
    logits[..., :8, 3] = 20.0  # early queries stare at key 3
    logits[..., -2:, 25] = 20.0  # the observation window (last 2 queries) stares at key 25
    attn = softmax_rows(logits)
    scores = snapkv_key_scores(attn, window=2, kernel=7, pool="max")
    assert scores.argmax() in range(22, 29)
    assert scores[25] > scores[3] * 10
    assert scores[22] == scores[25] == scores[28] and scores[21] < scores[22]  # neighbours survive


def test_pool_shapes_and_errors() -> None:
    s = np.array([0.0, 1.0, 0.0, 0.0, 5.0])
    np.testing.assert_array_equal(pool_1d(s, 3, "max"), [1, 1, 1, 5, 5])
    np.testing.assert_allclose(pool_1d(s, 3, "avg"), [0.5, 1 / 3, 1 / 3, 5 / 3, 2.5])
    with pytest.raises(ValueError, match="odd"):
        pool_1d(s, 4)


def test_block_scores_sum_mean_max_with_positions() -> None:
    key_scores = np.array([1.0, 2.0, 3.0, 4.0, 5.0])
    positions = np.array([10, 0, 11, -1, 30])  # cells out of position order, one padding cell
    ranges = [Range(0, 10), Range(10, 20), Range(20, 30)]
    np.testing.assert_allclose(block_scores(key_scores, positions, ranges), [2, 4, 0])
    np.testing.assert_allclose(block_scores(key_scores, positions, ranges, "mean"), [2, 2, 0])
    np.testing.assert_allclose(block_scores(key_scores, positions, ranges, "max"), [2, 3, 0])
    with pytest.raises(ValueError, match="5 key scores but 2"):
        block_scores(key_scores, [0, 1], ranges)
