"""``kvres serve --front local``: the HTTP front inside the backend's own process. The port is held by
the backend's worker, a bound session's turns run there without a Ray call (the front's ``/health``
counts the calls it answered in process), streamed and whole answers agree, a backend killed
comes back with its front on the same port and the session goes on, and the port is free once
the server stops."""

from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import time
from pathlib import Path

import httpx
import pytest

from tests.serve.conftest import free_port, start_server, stop_server, wait_healthy

BACK_WITHIN_S = 120.0


@pytest.fixture(scope="module")
def local_front(tmp_path_factory: pytest.TempPathFactory):
    srv = start_server(tmp_path_factory.mktemp("local-front"), free_port(), key=f"k-{secrets.token_hex(8)}",
                       args=["--front", "local"])
    wait_healthy(srv)
    yield srv
    stop_server(srv)


def _front(srv) -> dict:
    return httpx.get(f"{srv.base}/health", timeout=30).json()["front"]


def _listener_pid(port: int) -> int | None:
    """The process holding the listening socket of 127.0.0.1:``port`` (from /proc)."""
    inodes = set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if fields[1].endswith(f":{port:04X}") and fields[3] == "0A":
            inodes.add(fields[9])
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            links = [os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")]
        except OSError:
            continue
        if any(link[len("socket:["):-1] in inodes for link in links if link.startswith("socket:[")):
            return int(pid)
    return None


def _cmdline(pid: int) -> str:
    return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()


def test_the_backend_process_holds_the_port_and_runs_the_turns(local_front) -> None:
    port = int(local_front.base.rsplit(":", 1)[1])
    front = _front(local_front)
    assert list(front["in_process"]) == ["b0"], front
    holder = _listener_pid(port)
    assert holder == front["pid"] and "BackendServer" in _cmdline(holder), (holder, front)

    client = local_front.client()
    sid = {"X-Session-Id": f"local-{secrets.token_hex(4)}"}
    messages = [{"role": "user", "content": "hello"}]
    before = _front(local_front)["in_process"]["b0"]
    first = client.chat.completions.create(model=local_front.model, messages=messages, max_tokens=8, temperature=0,
                                           extra_headers=sid)
    assert _front(local_front)["in_process"]["b0"] > before  # answered in the backend's process
    messages += [{"role": "assistant", "content": first.choices[0].message.content or ""},
                 {"role": "user", "content": "what is 3 plus 4?"}]
    whole = client.chat.completions.create(model=local_front.model, messages=messages, max_tokens=8, temperature=0)
    streamed = "".join(chunk.choices[0].delta.content or "" for chunk in client.chat.completions.create(
        model=local_front.model, messages=messages, max_tokens=8, temperature=0, stream=True,
        extra_headers=sid) if chunk.choices)
    assert streamed == whole.choices[0].message.content and streamed


def test_a_killed_backend_comes_back_with_its_front_and_the_session(local_front) -> None:
    client = local_front.client()
    sid = {"X-Session-Id": f"kept-{secrets.token_hex(4)}"}
    messages = [{"role": "user", "content": "hello"}]
    first = client.chat.completions.create(model=local_front.model, messages=messages, max_tokens=8, temperature=0,
                                           extra_headers=sid)
    messages += [{"role": "assistant", "content": first.choices[0].message.content or ""},
                 {"role": "user", "content": "and then?"}]
    pid = _front(local_front)["pid"]
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + BACK_WITHIN_S
    while True:
        try:
            front = _front(local_front)
            if front["pid"] != pid and front["in_process"]:
                break
        except (httpx.HTTPError, KeyError, ValueError):
            pass
        assert time.monotonic() < deadline, f"no front on the port {BACK_WITHIN_S:.0f} s after the backend's kill"
        time.sleep(0.5)
    after = client.chat.completions.create(model=local_front.model, messages=messages, max_tokens=8, temperature=0,
                                           extra_headers=sid)
    assert after.usage is not None and after.usage.prompt_tokens_details is not None
    # the session came back from its journal: everything before the new message is still held
    assert after.usage.prompt_tokens_details.cached_tokens >= first.usage.prompt_tokens + first.usage.completion_tokens - 1


def test_the_port_is_free_once_the_server_stops(tmp_path: Path) -> None:
    port = free_port()
    srv = start_server(tmp_path, port, key=None, args=["--front", "local"], replicas=1)
    try:
        wait_healthy(srv)
    finally:
        stop_server(srv)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", port))


def test_a_client_that_leaves_mid_stream_leaves_its_session_what_was_sent(local_front) -> None:
    """The stream of a backend called in process ends where its HTTP client left, as through Ray."""
    http = local_front.http()
    messages = [{"role": "user", "content": "Go on and on."}]
    body = {"model": local_front.model, "messages": messages, "max_tokens": 300, "temperature": 0,
            "ignore_eos": True}
    whole_id, left_id = (f"{kind}-{secrets.token_hex(4)}" for kind in ("whole", "left"))
    whole = http.post("/v1/chat/completions", json=body, headers={"X-Session-Id": whole_id})
    assert whole.status_code == 200, whole.text
    prompt = whole.json()["usage"]["prompt_tokens"]
    want = http.get(f"/v1/sessions/{whole_id}/tokens").json()["tokens"]
    with http.stream("POST", "/v1/chat/completions", json={**body, "stream": True},
                     headers={"X-Session-Id": left_id}) as stream:
        assert stream.status_code == 200
        pieces = 0
        for line in stream.iter_lines():
            if line.startswith("data: {") and json.loads(line[6:])["choices"][0]["delta"].get("content"):
                pieces += 1
                if pieces == 3:
                    break
    deadline = time.monotonic() + 60
    while (r := http.post(f"/v1/sessions/{left_id}/rollback", json={"count": 0})).status_code == 409:
        assert time.monotonic() < deadline, "the hold of a stream its client left was never released"
        time.sleep(0.1)
    assert r.status_code == 200, r.text
    log = http.get(f"/v1/sessions/{left_id}/tokens").json()["tokens"]
    kept = len(log) - prompt
    assert log == want[:prompt + kept] and 3 <= kept < 300  # the prompt and what was sent, nothing more
