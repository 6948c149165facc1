"""A recall prepared ahead of the turn (``Executor.prepare_recall``: the blocks read, checked,
merged with the resident KV, moved and loaded into the scoring context / request while the
backend is idle) scores, exchanges and appends exactly as one that prepares nothing, on llama.cpp
and OpenVINO state mode with the committed passkey model; it is not used once the session, the
blocks or the scoring context changed."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from kvres.policy.ranges import Range
from tests.openvino.test_recall_exchange import TOKENS, TURN, _spilled

PASSKEY = Path(__file__).resolve().parents[2] / "models" / "passkey.gguf"


@pytest.fixture(params=["llama", "openvino"])
def ex(request: pytest.FixtureRequest) -> Iterator[Any]:
    if request.param == "llama":
        from kvres.actors.engines.llama import LlamaExecutor

        executor = LlamaExecutor(PASSKEY, n_ctx=1024, n_seq_max=4, n_threads=1)
        yield executor
        executor.close()
    else:
        from kvres.actors.engines.openvino import openvino_executor

        yield openvino_executor(PASSKEY, mode="state")


@pytest.mark.parametrize("rebase", [False, True])
def test_a_prepared_recall_scores_and_exchanges_as_an_unprepared_one(ex: Any, rebase: bool) -> None:
    ready, cold = _spilled(ex, "ready", rebase), _spilled(ex, "cold", rebase)
    assert ex.prepare_recall("ready", list(ready.values()), rebase)
    a = ex.recall_attention("ready", list(ready.values()), TURN, 4, rebase)
    assert not ex._recall_preps  # taken by the recall
    b = ex.recall_attention("ready", list(ready.values()), TURN, 4, rebase)  # read afresh
    assert np.array_equal(a.probs, b.probs) and np.array_equal(a.key_positions, b.key_positions)
    ex.recall_attention("cold", list(cold.values()), TURN, 4, rebase)
    evict = [Range(200, 240)]
    out_a = ex.exchange("ready", evict, [ready[Range(100, 104)]], rebase)
    out_b = ex.exchange("cold", evict, [cold[Range(100, 104)]], rebase)
    assert (out_a[0].token_range, out_a[0].positions, out_a[0].payload_nbytes) == \
        (out_b[0].token_range, out_b[0].positions, out_b[0].payload_nbytes)
    assert (ex.cache_positions("ready") == ex.cache_positions("cold")).all()
    x, y = ex.append("ready", TURN), ex.append("cold", TURN)  # both take their scoring pass's turn
    assert np.abs(x - y).max() < 1e-2 and x.argmax() == y.argmax()


def test_a_prepared_recall_is_not_used_once_the_session_changed(ex: Any) -> None:
    ready = _spilled(ex, "ready", False)
    assert ex.prepare_recall("ready", list(ready.values()), False)
    ex.append("ready", TURN[:3])  # the positions change: what was prepared no longer holds
    a = ex.recall_attention("ready", list(ready.values()), TURN, 4, False)
    b = ex.recall_attention("ready", list(ready.values()), TURN, 4, False)
    assert np.array_equal(a.probs, b.probs) and a.key_positions.size == len(TOKENS) + 3 + len(TURN)
    # prepared for other blocks, a recall reads its own
    assert ex.prepare_recall("ready", list(ready.values())[:1], False)
    a = ex.recall_attention("ready", list(ready.values()), TURN, 4, False)
    assert np.array_equal(a.probs, b.probs)
    assert ex.prepare_recall("ready", list(ready.values()), False)
    ex.close_session("ready")
    assert not ex._recall_preps  # a closed session's preparation goes with it


def test_a_prepared_recall_after_another_scoring_pass_restores_its_state_again(ex: Any) -> None:
    ready, _ = _spilled(ex, "ready", True), _spilled(ex, "other", True)
    assert ex.prepare_recall("ready", list(ready.values()), True)
    ex.attention("other", 4)  # the scoring context / request is used (and cleared) in between
    a = ex.recall_attention("ready", list(ready.values()), TURN, 4, True)
    b = ex.recall_attention("ready", list(ready.values()), TURN, 4, True)
    assert np.array_equal(a.probs, b.probs)


def test_blocks_carrying_other_token_ids_are_refused_before_anything_changes(ex: Any) -> None:
    """A cold block whose token ids are not the session's over its range (another session's, or
    forged) is refused by every recall path with the range named; the session is as it was."""
    from dataclasses import replace

    from kvres.policy import BlockMismatchError

    blocks = _spilled(ex, "forged", False)
    good = blocks[Range(100, 104)]
    forged = replace(good, token_ids=tuple(t + 1 for t in good.token_ids))
    before = (ex.resident_ranges("forged"), ex.cache_positions("forged").tolist())
    for attempt in (lambda: ex.recall_attention("forged", [forged], TURN, 4, False),
                    lambda: ex.exchange("forged", [Range(200, 240)], [forged], False)):
        with pytest.raises(BlockMismatchError, match=r"\[100, 104\).* other token ids than session 'forged'"):
            attempt()
        assert (ex.resident_ranges("forged"), ex.cache_positions("forged").tolist()) == before
    ex.exchange("forged", [Range(200, 240)], [good], False)  # the real block still comes back
    assert any(r.start <= 100 and r.end >= 104 for r in ex.resident_ranges("forged"))
