"""Sessions paused for tools on the real llama.cpp engine (stories260K): a session whose turn ended
in tool calls gives up its slot or its room after the idle sessions, for its ``tool_pause_s``; its
next call ends the pause; one that had to be parked is brought back ahead of its results once a
slot and room are free (``tool_prefetches``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvres.actors.config import BackendConfig, SessionPolicy
from kvres.actors.host.backend import BackendHost
from kvres.cluster.status_view import render_inspect
from tests.conftest import local_host, shared_model_path, wait_until

PROMPT = [3 + (7 * i) % 200 for i in range(40)]
OTHER = [5 + (11 * i) % 200 for i in range(40)]  # shares no prefix with PROMPT (nothing taken from another session)


def make_host(tmp_path: Path, n_seq_max: int = 2, budget: int = 1000) -> BackendHost:
    config = BackendConfig(name="tools", model_path=shared_model_path(), n_ctx=1024, n_seq_max=n_seq_max,
                           kv_budget_tokens=budget, n_threads=1)
    host: BackendHost = local_host(config, tmp_path / "cold")
    return host


def opened(host: BackendHost, sid: str, policy: SessionPolicy | None = None, prompt: list[int] = PROMPT) -> None:
    host.open_session(sid, policy)
    host.append(sid, prompt)


def stats(host: BackendHost, sid: str) -> dict:
    return host.session_stats(sid)


def test_a_session_paused_for_tools_keeps_its_slot_over_an_idle_one(tmp_path: Path) -> None:
    host = make_host(tmp_path)
    opened(host, "agent")  # used first: the least recently used
    opened(host, "idle")
    host.pause_for_tools("agent")
    assert stats(host, "agent")["paused_for_tools"] and not stats(host, "idle")["paused_for_tools"]
    assert "paused for tools now (up to 30 s)" in render_inspect(stats(host, "agent"))  # kvres inspect says so
    assert "tool pauses up to 30 s" in render_inspect(stats(host, "idle"))
    opened(host, "newcomer")  # two slots: one of the two goes
    assert stats(host, "idle")["state"] == "suspended" and stats(host, "agent")["state"] == "live"
    assert stats(host, "idle")["counters"]["suspends"] == 1
    host.append("agent", [5, 6])  # the results came: the pause is over
    assert not stats(host, "agent")["paused_for_tools"]


def test_within_its_budget_a_paused_session_keeps_its_room_over_an_idle_one(tmp_path: Path) -> None:
    host = make_host(tmp_path, n_seq_max=8, budget=2 * len(PROMPT) + 10)  # two sessions' worth
    opened(host, "agent")
    opened(host, "idle", prompt=OTHER)
    host.pause_for_tools("agent")
    opened(host, "newcomer", prompt=list(reversed(OTHER)))
    assert stats(host, "idle")["state"] == "suspended" and stats(host, "agent")["state"] == "live"
    assert stats(host, "idle")["counters"]["suspends"] == 1


def test_tool_pause_s_zero_leaves_the_order_to_recency(tmp_path: Path) -> None:
    host = make_host(tmp_path)
    opened(host, "agent", SessionPolicy().with_retention(tool_pause_s=0))
    opened(host, "idle")
    host.pause_for_tools("agent")
    assert not stats(host, "agent")["paused_for_tools"]
    opened(host, "newcomer")
    assert stats(host, "agent")["state"] == "suspended" and stats(host, "idle")["state"] == "live"


def test_past_tool_pause_s_a_paused_session_is_an_ordinary_idle_one(tmp_path: Path) -> None:
    host = make_host(tmp_path)
    opened(host, "agent", SessionPolicy().with_retention(tool_pause_s=0.2))
    opened(host, "idle")
    host.pause_for_tools("agent")
    assert wait_until(lambda: not stats(host, "agent")["paused_for_tools"])
    opened(host, "newcomer")
    assert stats(host, "agent")["state"] == "suspended"
    assert stats(host, "agent")["counters"]["tool_pause_suspends"] == 0


def test_a_session_parked_while_paused_comes_back_ahead_of_its_results(tmp_path: Path) -> None:
    host = make_host(tmp_path)
    opened(host, "agent")
    opened(host, "twin")  # the same tokens: what the agent must continue as
    host.pause_for_tools("agent")
    host.pause_for_tools("twin")
    opened(host, "newcomer")  # every other slot holder is paused: the least recent of them goes
    assert stats(host, "agent")["state"] == "suspended"
    assert stats(host, "agent")["counters"]["tool_pause_suspends"] == 1
    host.close("newcomer")  # a slot and room are free: the agent is read back before its call comes
    assert wait_until(lambda: stats(host, "agent")["state"] == "live")
    counters = stats(host, "agent")["counters"]
    assert counters["tool_prefetches"] == 1 and counters["admissions"] > 0
    assert stats(host, "agent")["paused_for_tools"]  # still waiting for its results
    assert list(host.generate("agent", 12)) == list(host.generate("twin", 12))
    assert stats(host, "agent")["counters"]["resumes"] == 0  # its call found it live


def test_the_idle_clock_does_not_park_a_paused_session(tmp_path: Path) -> None:
    host = make_host(tmp_path, n_seq_max=4)
    opened(host, "agent", SessionPolicy().with_retention(idle_suspend_s=0.2))
    host.pause_for_tools("agent")
    assert not wait_until(lambda: stats(host, "agent")["state"] != "live", timeout_s=1.0)
    host.append("agent", [5, 6])  # its results came and went: the idle clock parks it again
    assert wait_until(lambda: stats(host, "agent")["state"] == "suspended")


def test_a_callers_suspend_ends_the_pause(tmp_path: Path) -> None:
    host = make_host(tmp_path, n_seq_max=4)
    opened(host, "agent")
    host.pause_for_tools("agent")
    host.suspend("agent")
    assert not stats(host, "agent")["paused_for_tools"]
    assert not wait_until(lambda: stats(host, "agent")["state"] != "suspended", timeout_s=0.5)


@pytest.mark.parametrize("value", [-1.0, 1e9])
def test_a_bad_tool_pause_s_is_named(value: float) -> None:
    with pytest.raises(ValueError, match="tool_pause_s"):
        SessionPolicy().with_retention(tool_pause_s=value)
