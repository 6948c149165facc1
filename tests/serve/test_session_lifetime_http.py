"""Sessions the HTTP front opens end: parked after ``--session-idle``, closed after ``--session-ttl``
(or what a request's ``X-Session-Idle`` / ``X-Session-TTL`` asks), through the real ``kvres serve``
with short values; and ``/health`` answers 503 while no backend of the model answers. The module runs
on the direct front where the suite's is the default one inside the backends' processes (whose
``/health`` stops with the backend), so that front has a module of its own."""

from __future__ import annotations

import contextlib
import os
import signal
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import httpx
import pytest

from .conftest import Server, free_port, served_front, start_server, stop_server, wait_healthy

IDLE_S = 2
TTL_S = 8
WAIT_S = 120  # how long a look for what the timers do may take on a loaded machine (no timing is asserted)
TEXT_ONLY = {"grammar": "root ::= [a-z ]+"}
T = TypeVar("T")


@pytest.fixture(scope="module")
def short_lived(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    front = "direct" if served_front() == "local" else served_front()
    srv = start_server(tmp_path_factory.mktemp("lifetime"), free_port(), key=f"k-{uuid.uuid4().hex}", replicas=1,
                       args=["--session-idle", str(IDLE_S), "--session-ttl", str(TTL_S), "--front", front])
    wait_healthy(srv)
    yield srv
    stop_server(srv)


def _chat(http: httpx.Client, model: str, session: str, **headers: str) -> httpx.Response:
    body = {"model": model, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4, "temperature": 0,
            **TEXT_ONLY}
    return http.post("/v1/chat/completions", json=body, headers={"X-Session-Id": session, **headers})


def _until(look: Callable[[], T | None], what: str, srv: Server) -> T:
    deadline = time.monotonic() + WAIT_S
    while (seen := look()) is None:
        if time.monotonic() > deadline:
            pytest.fail(f"{what} did not happen within {WAIT_S} s:\n{srv.log()}", pytrace=False)
        time.sleep(0.5)
    return seen


def test_the_lifetime_is_printed_at_start(short_lived: Server) -> None:
    assert any(f"sessions parked after {IDLE_S} s without a call, closed after {TTL_S} s without one" in line
               for line in short_lived.output), short_lived.log()


def test_a_bound_session_is_parked_when_idle_goes_on_and_is_closed_when_expired(short_lived: Server) -> None:
    http, sid = short_lived.http(), f"idle-{uuid.uuid4().hex[:8]}"
    first = _chat(http, short_lived.model, sid)
    assert first.status_code == 200, first.text
    policy = http.get(f"/v1/sessions/{sid}").json()["policy"]
    assert (policy["idle_suspend_s"], policy["ttl_s"]) == (IDLE_S, TTL_S)

    def parked() -> dict | None:
        stats = http.get(f"/v1/sessions/{sid}").json()
        return stats if stats["state"] == "suspended" else None

    stats = _until(parked, "parking the idle session", short_lived)
    assert stats["counters"]["idle_suspends"] == 1
    again = _chat(http, short_lived.model, sid)  # a parked session's next turn resumes it
    assert again.status_code == 200, again.text
    assert http.get(f"/v1/sessions/{sid}").json()["state"] != "suspended"

    _until(lambda: True if http.get(f"/v1/sessions/{sid}").status_code == 404 else None,
           "closing the expired session", short_lived)
    listed = http.get("/v1/sessions", params={"limit": 1000}).json()["data"]
    assert sid not in [s["id"] for s in listed]


def test_a_request_sets_its_sessions_clocks_through_headers(short_lived: Server) -> None:
    http = short_lived.http()
    kept, default = f"kept-{uuid.uuid4().hex[:8]}", f"default-{uuid.uuid4().hex[:8]}"
    r = _chat(http, short_lived.model, kept, **{"X-Session-TTL": "3600", "X-Session-Idle": "1800"})
    assert r.status_code == 200, r.text
    assert _chat(http, short_lived.model, default).status_code == 200
    policy = http.get(f"/v1/sessions/{kept}").json()["policy"]
    assert (policy["idle_suspend_s"], policy["ttl_s"]) == (1800, 3600)
    _until(lambda: True if http.get(f"/v1/sessions/{default}").status_code == 404 else None,
           "closing the session of the default TTL", short_lived)
    stats = http.get(f"/v1/sessions/{kept}").json()
    assert stats["state"] != "suspended" and stats["counters"]["idle_suspends"] == 0
    assert http.delete(f"/v1/sessions/{kept}").status_code == 200

    for header, value in (("X-Session-TTL", "0"), ("X-Session-TTL", "soon"), ("X-Session-Idle", "1e9")):
        bad = _chat(http, short_lived.model, f"bad-{uuid.uuid4().hex[:8]}", **{header: value})
        assert bad.status_code == 400, bad.text
        error = bad.json()["error"]
        assert error["param"] == header and repr(value) in error["message"] and "2592000" in error["message"]


def test_a_responses_chain_ends_with_its_ttl(short_lived: Server) -> None:
    http = short_lived.http()
    body = {"model": short_lived.model, "input": "hello", "max_output_tokens": 4, "temperature": 0}
    first = http.post("/v1/responses", json=body)
    assert first.status_code == 200, first.text

    sid = first.json()["kvres"]["session_id"]
    assert http.get(f"/v1/sessions/{sid}").json()["policy"]["ttl_s"] == TTL_S
    _until(lambda: True if http.get(f"/v1/sessions/{sid}").status_code == 404 else None,
           "closing the Responses chain's session", short_lived)  # (a look is no call: its clocks go on)
    closed = http.post("/v1/responses", json={**body, "previous_response_id": first.json()["id"]})
    assert closed.status_code == 404, closed.text
    assert closed.json()["error"]["code"] == "response_not_found" and "was closed" in closed.json()["error"]["message"]


def _descendants(root: int) -> list[int]:
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, ValueError, IndexError):
                parents[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
    found, frontier = [], {root}
    while frontier:
        frontier = {pid for pid, ppid in parents.items() if ppid in frontier}
        found.extend(frontier)
    return found


def _backend_processes(srv: Server) -> list[int]:
    pids = []
    for pid in _descendants(srv.process.pid):
        with contextlib.suppress(OSError):
            if Path(f"/proc/{pid}/cmdline").read_bytes().startswith(b"ray::BackendServer"):
                pids.append(pid)
    return pids


def test_health_is_503_while_no_backend_of_the_model_answers(short_lived: Server) -> None:
    ok = httpx.get(f"{short_lived.base}/health", timeout=60)
    assert ok.status_code == 200, ok.text
    assert ok.json()["status"] == "ok" and ok.json()["models"] == {short_lived.model: {"backends": {"b0": "ok"}}}
    backends = _backend_processes(short_lived)
    assert len(backends) == 1, backends
    os.kill(backends[0], signal.SIGSTOP)  # the backend's process there, answering nothing
    try:
        down = httpx.get(f"{short_lived.base}/health", timeout=60)
        assert down.status_code == 503, down.text
        assert down.json()["status"] == "unavailable"
        assert down.json()["models"] == {short_lived.model: {"backends": {"b0": "unreachable"}}}
    finally:
        os.kill(backends[0], signal.SIGCONT)
    _until(lambda: True if httpx.get(f"{short_lived.base}/health", timeout=60).status_code == 200 else None,
           "/health answering again", short_lived)
