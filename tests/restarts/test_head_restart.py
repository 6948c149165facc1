"""The head of a standing cluster (``kvres.cluster.standing.start_standing``, its own port and temp
dir) is stopped (its processes only, ``stop_head``) and started again. With GCS fault tolerance
(Debian's ``redis-server`` started here on a free port, or Ray's embedded RocksDB storage) a live
and a suspended session both come back with the greedy tokens they would have given (their KV
recomputed from the journal: the old head's cold store is gone with its node). Without it the user
is told why the sessions are gone (``ClusterRestartedError``, an ``UnknownSessionError``), and
the earlier run's store folder is removed by the next start."""

from __future__ import annotations

import pytest

from tests.conftest import shared_model_path

pytestmark = pytest.mark.timeout(600)


@pytest.mark.parametrize("fault_tolerance", ["redis", "rocksdb"])
def test_with_gcs_fault_tolerance_a_head_restart_loses_no_session(fault_tolerance, tmp_path) -> None:
    from benchmarks.faults.head_restart import head_restart

    result = head_restart(str(shared_model_path()), fault_tolerance, tmp_path)
    assert result["errors"] == []
    assert result["sessions_lost"] == 0 and result["identical"] == result["sessions"] == 2
    assert len(result["folders_after"]) == 1 and result["folders_after"] != result["folders_before"]


def test_without_it_the_user_is_told_and_nothing_is_left_on_disk(tmp_path) -> None:
    from benchmarks.faults.head_restart import head_restart

    result = head_restart(str(shared_model_path()), None, tmp_path)
    assert result["sessions_lost"] == result["sessions"] == 2
    assert all("ClusterRestartedError" in e and "restarted without GCS fault tolerance" in e
               for e in result["errors"]), result["errors"]
    assert any("this session's blocks were left by the earlier run" in e for e in result["errors"])
    assert len(result["folders_after"]) == 1 and result["folders_after"] != result["folders_before"]


def test_the_restart_error_is_an_unknown_session_error_that_pickles_whole() -> None:
    import pickle

    from kvres.policy import UnknownSessionError
    from kvres.policy.errors import ClusterRestartedError

    err = pickle.loads(pickle.dumps(ClusterRestartedError("s1", "the head restarted")))
    assert isinstance(err, UnknownSessionError) and err.session_id == "s1"
    assert str(err) == "unknown session id 's1': the head restarted"
