"""Which cluster a command without an address looks at (``kvres status``, ``inspect``, ``top``):
the one ``ray start`` recorded last where it runs, else the only one; none, or several with none
recorded, is refused with a message naming them."""

from __future__ import annotations

import pytest

from kvres.cluster.cluster_view import NoClusterError, choose_local_cluster

A, B = "10.0.0.1:6379", "10.0.0.1:6380"


def test_the_recorded_cluster_is_taken_and_the_others_are_named() -> None:
    assert choose_local_cluster([A], A) == (A, "the last one `ray start` started here")
    address, why = choose_local_cluster([A, B], B)
    assert address == B and f"1 more run here ({A}): --address picks another" in why
    assert choose_local_cluster([A], B, recorded_answers=True)[0] == B  # listed under another name


def test_the_only_cluster_is_taken() -> None:
    assert choose_local_cluster([A], None) == (A, "the only Ray cluster on this machine")
    assert choose_local_cluster([A], B) == (A, "the only Ray cluster on this machine")  # a stale record


def test_several_unrecorded_clusters_or_none_are_refused_by_name() -> None:
    with pytest.raises(NoClusterError, match=rf"2 Ray clusters run on this machine \({A}, {B}\).*--address"):
        choose_local_cluster([B, A], None)
    with pytest.raises(NoClusterError, match="no Ray cluster runs on this machine"):
        choose_local_cluster([], None)
