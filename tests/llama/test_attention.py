"""Attention capture (scoring context, flash attention off) and SnapKV block scores."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from kvres.actors.engines.llama import LlamaExecutor
from kvres.policy import Range
from kvres.policy.scorers import SnapKV

from .conftest import story_tokens

FILLER = " The sun was hot and the sky was blue. The birds sang in the trees and the flowers were pretty."


def test_rows_are_distributions_over_resident_keys(make_llama: Callable[..., LlamaExecutor]) -> None:
    executor = make_llama()
    executor.open_session("s")
    executor.append("s", story_tokens(executor, 160))
    executor.evict_range("s", Range(20, 60), rebase=True)
    cap = executor.attention("s", window=12)
    n_keys = 120
    assert cap.probs.shape == (5, 8, 12, n_keys)  # layers, query heads, queries, resident keys
    np.testing.assert_allclose(cap.probs.sum(axis=-1), 1.0, atol=1e-4)
    assert cap.key_positions.tolist() == list(range(20)) + list(range(60, 160))
    assert cap.query_positions.tolist() == list(range(148, 160))
    for j in range(12):  # causal: query j sees keys up to its own
        assert np.all(cap.probs[:, :, j, n_keys - 12 + j + 1 :] == 0.0)
        assert np.all(cap.probs[:, :, j, : n_keys - 12 + j + 1].sum(axis=-1) > 0.99)


def test_an_attended_block_ranks_above_an_ignored_one(make_llama: Callable[..., LlamaExecutor]) -> None:
    """The story's opening (with the girl's name) draws the final "<name> said" queries' attention
    far more than filler sentences that sit closer to them; the block right before the queries
    draws the most (this model attends locally)."""
    executor = make_llama()
    for name in ("Lily", "Ben"):
        head = executor.tokenize(f"Once upon a time there was a girl named {name}.")
        tail = executor.tokenize(f" {name} said", add_bos=False)
        tokens = head + executor.tokenize(FILLER * 3, add_bos=False) + tail
        executor.open_session(name)
        executor.append(name, tokens)
        n, h = len(tokens), len(head)
        opening, filler_a, filler_b = Range(h - 8, h), Range(h + 8, h + 16), Range(h + 24, h + 32)
        recent = Range(n - len(tail) - 8, n - len(tail))
        scores = SnapKV(32).block_scores(executor.attention(name, 32), [opening, filler_a, filler_b, recent])
        assert scores[0] > 1.5 * max(scores[1], scores[2]), scores
        assert scores[3] > scores[0], scores
        raw = executor.attention(name, window=len(tail)).probs.sum(axis=(0, 1, 2))
        assert raw[opening.start : opening.end].sum() > 2 * raw[filler_a.start : filler_a.end].sum()


def test_scores_follow_token_log_positions_across_sessions_and_evictions(
    make_llama: Callable[..., LlamaExecutor],
) -> None:
    """Cells of two sessions interleave and evictions leave holes; scores stay keyed by the
    token log, identical to a session that never shared its context."""
    tokens = story_tokens(make_llama(), 200, 2)
    ranges = [Range(0, 16), Range(100, 140), Range(140, 200)]
    alone = make_llama()
    alone.open_session("s")
    alone.append("s", tokens)
    alone.evict_range("s", Range(16, 100), rebase=True)
    expected = SnapKV(32).block_scores(alone.attention("s", 32), ranges)
    shared = make_llama()
    shared.open_session("other")
    shared.open_session("s")
    other = story_tokens(shared, 200, 4)
    for a in range(0, 200, 50):
        shared.append("other", other[a : a + 50])
        shared.append("s", tokens[a : a + 50])
    shared.evict_range("s", Range(16, 100), rebase=True)
    np.testing.assert_allclose(SnapKV(32).block_scores(shared.attention("s", 32), ranges), expected, rtol=1e-5)


def test_scoring_leaves_serving_untouched(make_llama: Callable[..., LlamaExecutor]) -> None:
    """The scoring pass runs in its own context: the serving cache and its logits do not move."""
    results = []
    for score in (False, True):
        executor = make_llama()
        executor.open_session("s")
        executor.append("s", story_tokens(executor, 100))
        if score:
            SnapKV(32).block_scores(executor.attention("s", 32), [Range(0, 50), Range(50, 100)])
        results.append(executor.append("s", [13]))
        assert executor.flash_attn
    assert np.max(np.abs(results[0] - results[1])) == 0.0
