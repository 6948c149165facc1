"""A worker node dies (``ray.cluster_utils.Cluster.remove_node``, no grace) under kvres: no session
is lost. Live and suspended sessions of its backend (pinned there, so not re-created: they move to
the head's backend, recomputed from their journal), one streamed, one migrated away from the dead
backend, and one on the head whose spilled blocks were in the dead node's cold store all continue
with their uninterrupted twins' greedy tokens; placement never picks the lost backend; what the
driver still sees of it is a typed kvres error naming backend and node."""

from __future__ import annotations

import pytest

from tests.conftest import shared_model_path

pytestmark = pytest.mark.timeout(900)


@pytest.fixture(scope="module")
def after_death():
    from benchmarks.faults.node_death import node_death

    return node_death(str(shared_model_path()))


def test_no_session_is_lost_and_each_continues_like_its_twin(after_death) -> None:
    assert after_death["errors"] == []
    assert after_death["sessions_lost"] == 0
    assert after_death["differ"] == []
    assert after_death["identical"] == after_death["sessions"] == 5
    assert after_death["spilled_blocks_before"] > 0  # the spilled session had blocks in the dead store
    assert after_death["spilled_blocks_dropped"] == after_death["spilled_blocks_before"]  # found gone, counted
    assert after_death["closed"] == 2 * after_death["sessions"]
    assert after_death["recover_s"] < 30
    assert set(after_death["directory"].values()) == {"h0"}  # the directory names where each moved
    assert set(after_death["handles"].values()) == {"h0"}  # and so does each Session object
    assert after_death["folders_left"] == []  # the dead node's store folder too, once shut down


def test_placement_and_status_drop_the_lost_backend(after_death) -> None:
    assert after_death["placed"] == ["h0", "h0", "h0"]
    assert "w0" not in after_death["view_backends"] and "w0" in after_death["view_lost"]
    assert "node" in after_death["lost_row"]["error"] and "dead" in after_death["lost_row"]["error"]
    assert after_death["open_on_lost"].startswith("NodeLostError: backend 'w0' is lost with node ")
