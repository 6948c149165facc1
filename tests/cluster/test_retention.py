"""Retention through ``kvres.cluster`` sessions on a real local Ray cluster (llama.cpp): an idle
session is parked by its backend and its next call brings it back; a session past its TTL is
closed, its blocks deleted and the planner's directory told, so the driver meets
``UnknownSessionError``; priority and pin travel with the policy into the session's stats."""

from __future__ import annotations

import pytest

from kvres.cluster import SessionPolicy
from kvres.cluster.status_view import render_inspect
from kvres.policy import UnknownSessionError
from tests.conftest import wait_until

PROMPT = [3 + (5 * i) % 180 for i in range(30)]


def test_an_idle_session_is_parked_and_its_next_call_brings_it_back(manager) -> None:
    s = manager.open_session(policy=SessionPolicy().with_retention(idle_suspend_s=0.5, priority=3), backend="b0")
    twin = manager.open_session(policy=SessionPolicy().with_retention(pin=True), backend="b0")
    try:
        for session in (s, twin):
            session.append(PROMPT)
        assert wait_until(lambda: s.stats()["state"] == "suspended")
        stats = s.stats()
        assert stats["counters"]["idle_suspends"] == 1 and stats["policy"]["priority"] == 3
        assert "retention  priority 3, parked after 0.5 s idle" in render_inspect(stats)  # kvres inspect
        held = twin.stats()
        assert held["state"] == "live" and held["policy"]["pin"] is True and held["pinned"] is True
        assert "retention  priority 0, pinned" in render_inspect(held)
        assert list(s.generate(10, ignore_eos=True)) == list(twin.generate(10, ignore_eos=True))
        assert s.stats()["state"] == "live"
    finally:
        for session in (s, twin):
            session.close()


def test_a_session_past_its_ttl_is_closed_and_the_directory_forgets_it(manager) -> None:
    s = manager.open_session(policy=SessionPolicy().with_retention(ttl_s=0.5), backend="b0")
    s.append(PROMPT)
    s.suspend()
    sid = s.session_id

    def gone() -> bool:
        try:
            manager.session(sid)
        except UnknownSessionError:
            return True
        return False

    assert wait_until(gone)
    with pytest.raises(UnknownSessionError):
        s.tokens()
    assert sid not in manager.planner_client.directory()


def test_a_tenant_over_its_quota_gives_up_its_own_session_first(manager) -> None:
    """b0 holds tenant "acme" to TENANT_RESIDENT_QUOTA resident tokens (tests/cluster/conftest.py):
    its second session's tokens suspend its first, not another tenant's idle session; a call no
    room can be made for within the quota is refused with the tenant, the quota and what it needs."""
    from kvres.actors.host.refusals import TenantQuotaError
    from tests.cluster.conftest import TENANT_RESIDENT_QUOTA

    other = manager.open_session(backend="b0")  # least recently used of all, but not acme's
    first = manager.open_session(policy=SessionPolicy().with_retention(tenant="acme"), backend="b0")
    second = manager.open_session(policy=SessionPolicy().with_retention(tenant="acme"), backend="b0")
    try:
        other.append(PROMPT)
        first.append(PROMPT)
        second.append(PROMPT)  # 2 x 30 fits the quota of 70, 3 x 30 would not
        assert first.stats()["state"] == "live"
        second.append(PROMPT[:15])
        assert first.stats()["state"] == "suspended" and other.stats()["state"] == "live"
        stats = second.stats()
        tenant = stats["tenant"]
        assert (tenant["name"], tenant["sessions"], tenant["resident_tokens"], tenant["resident_quota"]) == \
            ("acme", 2, 45, TENANT_RESIDENT_QUOTA)
        assert tenant["cold_bytes"] > 0 and tenant["cold_quota"] is None  # first's parked state
        assert f"tenant 'acme' holds 45 of {TENANT_RESIDENT_QUOTA} resident tokens" in render_inspect(stats)
        with pytest.raises(TenantQuotaError, match=rf"tenant 'acme' .* resident_tokens quota is {TENANT_RESIDENT_QUOTA}"):
            second.append(PROMPT * 3)  # 45 + 90 > 70 with nothing of acme's left to suspend
        assert len(second.tokens()) == 45  # the refused call committed nothing
        b0 = next(row for row in manager.status()["backends"] if row["backend"] == "b0")
        assert b0["tenants"]["acme"]["resident_tokens"] == 45
    finally:
        for session in (other, first, second):
            session.close()
