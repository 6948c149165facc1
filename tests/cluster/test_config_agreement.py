"""A driver's configuration against the one its cluster published (no cluster needed)."""

from __future__ import annotations

import pytest

from kvres.cluster import BackendConfig, KvresConfig
from kvres.cluster.config_agreement import ConfigConflictError, check_agreement

CLUSTER = KvresConfig(backends=[BackendConfig(name="b0", n_ctx=1024, kv_budget_tokens=512),
                                BackendConfig(name="b1", n_ctx=1024, kv_budget_tokens=512)])


def test_the_same_backends_or_a_subset_agree() -> None:
    check_agreement(CLUSTER, CLUSTER, "ns")
    check_agreement(KvresConfig(backends=[CLUSTER.backends[1]]), CLUSTER, "ns")


def test_a_backend_the_cluster_lacks_is_refused_by_name() -> None:
    with pytest.raises(ConfigConflictError, match=r"backend 'st0' is not one of the cluster's \['b0', 'b1'\]"):
        check_agreement(KvresConfig(backends=[BackendConfig(name="st0")]), CLUSTER, "ns")


def test_a_field_that_differs_is_named_with_both_values() -> None:
    mine = KvresConfig(backends=[BackendConfig(name="b0", n_ctx=2048, kv_budget_tokens=512)])
    with pytest.raises(ConfigConflictError, match=r"backend 'b0' differs: n_ctx=2048 \(the cluster's: 1024\)"):
        check_agreement(mine, CLUSTER, "ns")
