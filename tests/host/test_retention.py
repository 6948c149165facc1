"""Retention a session's owner controls, on the real llama.cpp engine (stories260K): priority and
pins in who gives up a slot or room, the pin cap, idle sessions parked and expired ones closed."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from kvres.actors.config import BackendConfig, SessionPolicy
from kvres.actors.host.backend import BackendHost
from kvres.policy import UnknownSessionError
from tests.conftest import local_host, shared_model_path, wait_until

PROMPT = [3 + (7 * i) % 200 for i in range(40)]


def make_host(tmp_path: Path, n_seq_max: int = 2, budget: int = 1000, max_pinned: int | None = None,
              expired: list[str] | None = None) -> BackendHost:
    model = shared_model_path()
    config = BackendConfig(name="keep", model_path=model, n_ctx=1024, n_seq_max=n_seq_max, kv_budget_tokens=budget,
                           n_threads=1, max_pinned_tokens=max_pinned)
    host: BackendHost = local_host(config, tmp_path / "cold", on_expired=None if expired is None else expired.append)
    return host


def opened(host: BackendHost, sid: str, policy: SessionPolicy | None = None) -> None:
    host.open_session(sid, policy)
    host.append(sid, PROMPT)


def state(host: BackendHost, sid: str) -> str:
    return str(host.session_stats(sid)["state"])


def test_the_lower_priority_gives_up_its_slot_before_the_least_recently_used(tmp_path: Path) -> None:
    host = make_host(tmp_path)
    opened(host, "important", SessionPolicy().with_retention(priority=5))  # used first: least recent
    opened(host, "casual")
    opened(host, "newcomer")  # two slots: one of the two goes
    assert state(host, "casual") == "suspended" and state(host, "important") == "live"


def test_a_pinned_session_keeps_its_slot_and_the_cap_bounds_pins(tmp_path: Path) -> None:
    host = make_host(tmp_path)
    opened(host, "pinned", SessionPolicy().with_retention(pin=True))
    opened(host, "other")
    assert host.session_stats("pinned")["pinned"] and not host.session_stats("other")["pinned"]
    opened(host, "newcomer")
    assert state(host, "other") == "suspended" and state(host, "pinned") == "live"

    capped = make_host(tmp_path / "capped", max_pinned=len(PROMPT) - 1)  # less than one session holds
    opened(capped, "pinned", SessionPolicy().with_retention(pin=True))
    assert not capped.session_stats("pinned")["pinned"]  # over the cap: treated as unpinned
    opened(capped, "other")
    opened(capped, "newcomer")
    assert state(capped, "pinned") == "suspended"


def test_an_idle_session_is_parked_and_continues_as_before(tmp_path: Path) -> None:
    host = make_host(tmp_path, n_seq_max=4)
    opened(host, "idle", SessionPolicy().with_retention(idle_suspend_s=0.3))
    opened(host, "twin")
    wait_until(lambda: state(host, "idle") == "suspended")
    assert state(host, "idle") == "suspended" and state(host, "twin") == "live"
    assert host.session_stats("idle")["counters"]["idle_suspends"] == 1
    assert list(host.generate("idle", 12)) == list(host.generate("twin", 12))  # resumed by the call
    assert host.session_stats("idle")["counters"]["idle_suspends"] == 1


def test_a_session_past_its_ttl_is_closed_and_reported(tmp_path: Path) -> None:
    expired: list[str] = []
    host = make_host(tmp_path, n_seq_max=4, expired=expired)
    opened(host, "brief", SessionPolicy().with_retention(ttl_s=0.3))
    opened(host, "lasting")
    host.suspend("brief")  # a parked session expires too, and its blocks go with it
    wait_until(lambda: bool(expired))
    assert expired == ["brief"]
    with pytest.raises(UnknownSessionError):
        host.tokens("brief")
    assert host.sessions() == ["lasting"]


def test_a_running_call_keeps_the_clock_from_running_out(tmp_path: Path) -> None:
    host = make_host(tmp_path, n_seq_max=4)
    opened(host, "busy", SessionPolicy().with_retention(ttl_s=2.0, idle_suspend_s=1.0))
    for _ in range(6):  # calls closer together than the limits: neither parked nor closed
        time.sleep(0.2)
        host.append("busy", [5, 6])
        assert state(host, "busy") == "live"
    assert host.session_stats("busy")["counters"]["idle_suspends"] == 0


@pytest.mark.parametrize("field, value", [("priority", 101), ("idle_suspend_s", 0), ("ttl_s", -1.0)])
def test_bad_retention_values_are_named(field: str, value: float) -> None:
    with pytest.raises(ValueError, match=field):
        SessionPolicy().with_retention(**{field: value})


def test_without_a_cold_store_an_idle_session_stays_live(tmp_path: Path) -> None:
    model = shared_model_path()
    config = BackendConfig(name="storeless", model_path=model, n_ctx=1024, n_seq_max=2, kv_budget_tokens=1000,
                           n_threads=1)
    host = local_host(config, None)  # nowhere to park it
    opened(host, "idle", SessionPolicy().with_retention(idle_suspend_s=0.2))
    assert not wait_until(lambda: state(host, "idle") != "live", timeout_s=1.0)
    assert host.session_stats("idle")["counters"]["idle_suspends"] == 0


def test_resuming_a_session_does_not_wake_the_timer_each_time(tmp_path: Path) -> None:
    """A session with limits is rebuilt at every resume; its clock starts again then, and the timer
    looks at least every ``RETENTION_POLL_S`` anyway, so a resume does not wake it (with many
    sessions over few slots a backend resumes one every turn, and each look takes the host's lock).
    A limit shorter than that still wakes it: such a session is parked in time."""
    from kvres.actors.host.context import RETENTION_POLL_S
    from kvres.actors.host.retention import RetentionTimer

    looks: list[float] = []
    check = RetentionTimer.check

    def counted(self: RetentionTimer, now: float) -> float:
        looks.append(now)
        return check(self, now)

    RetentionTimer.check = counted  # type: ignore[method-assign]
    try:
        host = make_host(tmp_path)
        opened(host, "kept", SessionPolicy().with_retention(ttl_s=600, idle_suspend_s=300))
        assert wait_until(lambda: bool(looks))  # the first session with limits wakes it
        t0 = time.monotonic()
        for _ in range(30):
            host.suspend("kept")
            host.resume("kept")
        elapsed = time.monotonic() - t0
        assert len(looks) <= 2 + elapsed / RETENTION_POLL_S + 1, (len(looks), elapsed)
        assert state(host, "kept") == "live"

        opened(host, "brief", SessionPolicy().with_retention(idle_suspend_s=0.3))  # under the timer's sleep
        assert wait_until(lambda: state(host, "brief") == "suspended")
    finally:
        RetentionTimer.check = check  # type: ignore[method-assign]
