"""A bound turn's path over HTTP is its one call to the backend: with the serve state actor's
process stopped (SIGSTOP: it answers nothing, so a call on the turn's path would hang), streamed
turns on a session the front already ran still answer, and a second request sent on the session
while one runs is still refused (the hold lives on the session's backend)."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
import uuid

import httpx

TEXT_ONLY = {"grammar": "root ::= [a-z ]+"}


def _state_actor_pid(server) -> int:
    """The serve state actor of this server's own Ray cluster (started in the server's session; Ray
    starts its process a moment after the front first uses it)."""
    deadline = time.monotonic() + 60
    while True:
        listing = subprocess.run(["ps", "-eo", "pid=,sid=,args="], capture_output=True, text=True, check=True).stdout
        found = [int(pid) for pid, sid, *args in (line.split(None, 2) for line in listing.splitlines())
                 if int(sid) == server.process.pid and args and args[0].startswith("ray::ServeStateActor")]
        if len(found) == 1:
            return found[0]
        assert time.monotonic() < deadline, f"the server's serve state actor: {found}"
        time.sleep(0.2)


def _turn(http: httpx.Client, model: str, sid: str, text: str, max_tokens: int = 6,
          streaming: threading.Event | None = None) -> tuple[int, str]:
    """``streaming``: set once the answer's first bytes arrived (the turn holds its session then)."""
    body = {"model": model, "messages": [{"role": "user", "content": text}], "max_tokens": max_tokens,
            "temperature": 0, "stream": True, "ignore_eos": True, **TEXT_ONLY}
    with http.stream("POST", "/v1/chat/completions", json=body, headers={"X-Session-Id": sid}) as r:
        parts = []
        for part in r.iter_text():
            parts.append(part)
            if streaming is not None:
                streaming.set()
        return r.status_code, "".join(parts)


def test_a_bound_turn_calls_nothing_but_its_backend(server) -> None:
    sid = f"path-{uuid.uuid4().hex[:10]}"
    with httpx.Client(base_url=server.base, headers=server.headers(), timeout=30) as http:
        code, body = _turn(http, server.model, sid, "Hello there.")  # opens the session (the front claims it)
        assert code == 200 and "[DONE]" in body, body
        pid = _state_actor_pid(server)
        os.kill(pid, signal.SIGSTOP)
        try:
            for turn in range(3):
                code, body = _turn(http, server.model, sid, f"Turn {turn}: go on.")
                assert code == 200 and "[DONE]" in body and '"error"' not in body, body
            streaming, long_answer = threading.Event(), []
            long_turn = threading.Thread(target=lambda: long_answer.append(
                _turn(http, server.model, sid, "On and on.", 400, streaming)))
            long_turn.start()
            assert streaming.wait(60), long_answer  # the long turn holds the session from here to its end
            with httpx.Client(base_url=server.base, headers=server.headers(), timeout=30) as other:
                refused = _turn(other, server.model, sid, "Me too.")
            long_turn.join(timeout=120)
            assert refused[0] == 409 and "session_busy" in refused[1], refused
            assert long_answer and long_answer[0][0] == 200 and "[DONE]" in long_answer[0][1], long_answer
        finally:
            os.kill(pid, signal.SIGCONT)
        assert http.delete(f"/v1/sessions/{sid}").status_code == 200
