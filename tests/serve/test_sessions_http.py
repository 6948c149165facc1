"""Session binding over HTTP (``X-Session-Id``), one request per session at a time (409), a client
that leaves mid-stream, the ``/v1/sessions`` routes, ``curl``, concurrent clients, ``/metrics``."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from .conftest import served_front

TEXT_ONLY = {"grammar": "root ::= [a-z ]+"}


def _sid(prefix: str = "t") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def _chat(http: httpx.Client, model: str, messages: list[dict], session: str | None = None, **fields) -> httpx.Response:
    headers = {"X-Session-Id": session} if session else {}
    body = {"model": model, "messages": messages, "max_tokens": 6, "temperature": 0, **TEXT_ONLY, **fields}
    return http.post("/v1/chat/completions", json=body, headers=headers)


def test_a_bound_conversation_prefills_only_each_turns_new_tokens(server) -> None:
    http, sid = server.http(), _sid("bound")
    messages: list[dict] = [{"role": "system", "content": "You answer in a few words."}]
    held = 0
    for turn in range(10):
        messages.append({"role": "user", "content": f"Turn {turn}: tell me more."})
        r = _chat(http, server.model, messages, sid)
        assert r.status_code == 200, r.text
        assert r.headers["x-session-id"] == sid
        usage = r.json()["usage"]
        assert usage["prompt_tokens_details"]["cached_tokens"] == held  # all the session held was kept
        stats = http.get(f"/v1/sessions/{sid}").json()
        held = usage["prompt_tokens"] + usage["completion_tokens"]
        assert stats["token_count"] == held
        messages.append({"role": "assistant", "content": r.json()["choices"][0]["message"]["content"]})
    assert stats["counters"]["recomputed_tokens"] == 0 and stats["counters"]["rollbacks"] == 0
    assert stats["http"]["turns"] == 10 and stats["http"]["cached_tokens"] > stats["http"]["prefilled_tokens"]

    # the same conversation without the binding prefills the whole history
    whole = _chat(http, server.model, messages[:-1]).json()["usage"]
    assert whole["prompt_tokens_details"]["cached_tokens"] == 0

    # an edited history: the session keeps what still agrees and replaces the rest
    edited = [dict(m) for m in messages]
    edited[3] = {"role": "user", "content": "Turn 1: something different."}
    r = _chat(http, server.model, edited + [{"role": "user", "content": "and?"}], sid)
    assert r.status_code == 200, r.text
    cached = r.json()["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert 0 < cached < held
    assert http.delete(f"/v1/sessions/{sid}").json()["deleted"] is True
    assert http.get(f"/v1/sessions/{sid}").status_code == 404


def _read_chunks(response: httpx.Response, count: int) -> str:
    text, n = "", 0
    for line in response.iter_lines():
        if line.startswith("data: {"):
            delta = json.loads(line[6:])["choices"][0]["delta"].get("content")
            if delta:
                text, n = text + delta, n + 1
                if n >= count:
                    break
    return text


def test_one_request_per_session_at_a_time(server) -> None:
    """Of two requests sent at once on one session, one runs and the other is refused (after the
    hold's ``RELEASE_GRACE_S``, shorter than the first's 1,500 tokens)."""
    sid = _sid("busy")
    body = {"model": server.model, "messages": [{"role": "user", "content": "Go on and on."}], "max_tokens": 1500,
            "temperature": 0, "stream": True, "ignore_eos": True}
    start = threading.Barrier(2)

    def call(_: int) -> tuple[int, str, str | None]:
        with server.http() as own:
            start.wait(timeout=30)
            with own.stream("POST", "/v1/chat/completions", json=body, headers={"X-Session-Id": sid}) as r:
                return r.status_code, r.read().decode(), r.headers.get("retry-after")

    with ThreadPoolExecutor(2) as pool:
        answers = sorted(pool.map(call, range(2)))
    assert [code for code, _, _ in answers] == [200, 409], answers
    error = json.loads(answers[1][1])["error"]
    assert error["code"] == "session_busy" and sid in error["message"]
    assert answers[1][2] == "1"  # Retry-After, in seconds
    server.http().delete(f"/v1/sessions/{sid}")


def test_a_client_that_leaves_mid_stream_keeps_what_it_received(server) -> None:
    http, sid = server.http(), _sid("left")
    body = {"model": server.model, "messages": [{"role": "user", "content": "Go on and on."}], "max_tokens": 1000,
            "temperature": 0, "stream": True, "ignore_eos": True}
    with http.stream("POST", "/v1/chat/completions", json=body, headers={"X-Session-Id": sid}) as stream:
        assert stream.status_code == 200
        received = _read_chunks(stream, 3)
    deadline = time.monotonic() + 60
    while (r := http.post(f"/v1/sessions/{sid}/rollback", json={"count": 0})).status_code == 409:
        assert time.monotonic() < deadline, "the hold of a stream its client left was never released"
        time.sleep(0.1)
    assert r.status_code == 200, r.text
    log = http.get(f"/v1/sessions/{sid}/tokens").json()
    # The log's text spells the special tokens (ignore_eos runs on past the end token); a stream leaves them out.
    spoken = re.sub(r"</?s>|<\|[a-z_]+\|>", "", log["text"])
    assert received.strip() and received.strip() in spoken
    whole = _chat(http, server.model, [{"role": "user", "content": "Go on and on."}], max_tokens=1000,
                  ignore_eos=True, grammar=None)  # the same turn run to its end, on a session of its own
    assert whole.status_code == 200, whole.text
    prompt = whole.json()["usage"]["prompt_tokens"]
    assert prompt < len(log["tokens"]) < prompt + 1000  # it stopped when its client left
    http.delete(f"/v1/sessions/{sid}")


def test_session_routes_suspend_resume_fork_rollback_export_restore(server) -> None:
    http, sid = server.http(), _sid("ops")
    r = _chat(http, server.model, [{"role": "user", "content": "Hello"}], sid)
    assert r.status_code == 200
    length = http.get(f"/v1/sessions/{sid}").json()["token_count"]
    assert sid in [s["id"] for s in http.get("/v1/sessions").json()["data"]]
    assert http.post(f"/v1/sessions/{sid}/suspend").json()["state"] == "suspended"
    assert http.get(f"/v1/sessions/{sid}").json()["state"] == "suspended"
    assert http.post(f"/v1/sessions/{sid}/resume").status_code == 200
    branch = http.post(f"/v1/sessions/{sid}/fork", json={"new_id": f"{sid}-b"}).json()
    assert branch["id"] == f"{sid}-b" and branch["forked_from"] == sid
    assert http.post(f"/v1/sessions/{sid}-b/rollback", json={"count": 2}).json()["token_count"] == length - 2
    assert http.get(f"/v1/sessions/{sid}").json()["token_count"] == length
    exported = http.post(f"/v1/sessions/{sid}/export")
    assert exported.status_code == 200 and exported.headers["content-type"] == "application/octet-stream"
    restored = http.post(f"/v1/sessions/{sid}-r/restore", content=exported.content)
    assert restored.status_code == 200, restored.text
    assert http.get(f"/v1/sessions/{sid}-r/tokens").json()["tokens"] == http.get(f"/v1/sessions/{sid}/tokens").json()["tokens"]
    bad = http.post(f"/v1/sessions/{sid}-x/restore", content=b"not a session file")
    assert bad.status_code == 400, bad.text
    assert http.post(f"/v1/sessions/{sid}/teleport").status_code == 400
    for s in (sid, f"{sid}-b", f"{sid}-r"):
        assert http.delete(f"/v1/sessions/{s}").status_code == 200
    assert http.delete(f"/v1/sessions/{sid}").status_code == 404


def test_curl_streams_a_chat_and_is_refused_without_the_key(server) -> None:
    curl = shutil.which("curl")
    if curl is None:
        pytest.fail("curl is not installed (apt-get install curl)", pytrace=False)
    body = json.dumps({"model": server.model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4,
                       "temperature": 0, "stream": True})
    out = subprocess.run([curl, "-sS", "-N", f"{server.v1}/chat/completions", "-H", "Content-Type: application/json",
                          "-H", f"Authorization: Bearer {server.key}", "-d", body],
                         capture_output=True, text=True, timeout=60, check=True).stdout
    events = [line[6:] for line in out.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]" and json.loads(events[0])["object"] == "chat.completion.chunk"
    refused = subprocess.run([curl, "-sS", "-o", "/dev/null", "-w", "%{http_code}", f"{server.v1}/models"],
                             capture_output=True, text=True, timeout=30, check=True).stdout
    assert refused == "401"
    health = subprocess.run([curl, "-sS", f"{server.base}/health"], capture_output=True, text=True, timeout=30,
                            check=True).stdout
    assert json.loads(health)["status"] == "ok"


def test_concurrent_clients_each_on_their_own_session(server) -> None:
    http = server.http()
    sids = [_sid("many") for _ in range(6)]
    barrier = threading.Barrier(len(sids))

    def conversation(sid: str) -> list[int]:
        with server.http() as own:
            messages: list[dict] = []
            cached = []
            for turn in range(3):
                messages.append({"role": "user", "content": f"{sid} turn {turn}"})
                if turn == 0:
                    barrier.wait(timeout=60)
                r = _chat(own, server.model, messages, sid)
                assert r.status_code == 200, r.text
                cached.append(r.json()["usage"]["prompt_tokens_details"]["cached_tokens"])
                messages.append({"role": "assistant", "content": r.json()["choices"][0]["message"]["content"]})
            return cached

    with ThreadPoolExecutor(len(sids)) as pool:
        results = list(pool.map(conversation, sids))
    for cached in results:
        assert cached[0] == 0 and 0 < cached[1] < cached[2]
    answers = list(ThreadPoolExecutor(4).map(
        lambda i: _chat(server.http(), server.model, [{"role": "user", "content": f"q{i}"}]), range(8)))
    assert [r.status_code for r in answers] == [200] * 8
    replicas = {r.headers["x-kvres-replica"] for r in answers}
    replicas |= {http.get("/v1/models").headers["x-kvres-replica"] for _ in range(20)}
    # stateless replicas: the sessions above were served by both (a front hosted in the backend's
    # process, --front local, is one per backend)
    assert len(replicas) == (1 if served_front() == "local" else 2)
    for sid in sids:
        http.delete(f"/v1/sessions/{sid}")


def test_the_session_list_comes_in_pages(server) -> None:
    http = server.http()
    opened = [_sid("page") for _ in range(3)]
    for sid in opened:
        assert _chat(http, server.model, [{"role": "user", "content": "hi"}], sid).status_code == 200
    whole = http.get("/v1/sessions", params={"limit": 1000}).json()
    assert whole["has_more"] is False and set(opened) <= {s["id"] for s in whole["data"]}
    pages, after = [], None
    while True:
        page = http.get("/v1/sessions", params={"limit": 2, **({"after": after} if after else {})}).json()
        assert len(page["data"]) <= 2
        pages.extend(s["id"] for s in page["data"])
        if not page["has_more"]:
            break
        after = page["last_id"]
        assert after == page["data"][-1]["id"]
    assert pages == [s["id"] for s in whole["data"]]  # in id order, each once
    assert len(http.get("/v1/sessions").json()["data"]) <= 100  # the default page
    for limit in ("0", "1001", "many"):
        bad = http.get("/v1/sessions", params={"limit": limit})
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "limit" and "1..1000" in bad.text
    for sid in opened:
        http.delete(f"/v1/sessions/{sid}")


def test_health_and_metrics_per_route(server) -> None:
    http = server.http()
    _chat(http, server.model, [{"role": "user", "content": "count me"}], stream=True).read()
    assert http.get("/v1/sessions/never-opened").status_code == 404
    text = http.get("/metrics").text
    assert 'kvres_serve_requests_total{route="/v1/chat/completions",status="200"}' in text
    assert 'kvres_serve_time_to_first_token_seconds_bucket{route="/v1/chat/completions",le="+Inf"}' in text
    assert 'kvres_serve_inter_token_latency_seconds_count{route="/v1/chat/completions"}' in text
    assert 'kvres_serve_queue_depth{route="/v1/chat/completions"}' in text
    assert 'kvres_serve_requests_total{route="/v1/sessions/{id}",status="404"}' in text


def test_a_prompt_past_what_a_session_holds_is_a_400_and_a_reply_stops_there(server) -> None:
    """The server's backend keeps every token of a session resident within kv_budget_tokens=2000
    (conftest): that is the context ``/v1/models`` states, a longer prompt is refused naming it,
    and a reply that reaches it ends with finish_reason "length"."""
    http = server.http()
    card = next(m for m in http.get("/v1/models").json()["data"] if m["id"] == server.model)
    assert card["context_length"] == 2000
    body = {"model": server.model, "max_tokens": 50, "temperature": 0, "ignore_eos": True}
    refused = http.post("/v1/completions", json={**body, "prompt": [5] * 2001})
    assert refused.status_code == 400, refused.text
    error = refused.json()["error"]
    assert error["code"] == "context_length_exceeded" and "2001 is past the 2000 tokens" in error["message"]
    too_long = http.post("/v1/completions", json={**body, "prompt": [5] * 10, "max_tokens": 2001})
    assert too_long.status_code == 400 and too_long.json()["error"]["param"] == "max_tokens"
    ends = http.post("/v1/completions", json={**body, "prompt": [5] * 1990})
    assert ends.status_code == 200, ends.text
    assert ends.json()["usage"]["completion_tokens"] == 10 and ends.json()["choices"][0]["finish_reason"] == "length"
    chunks = []
    with http.stream("POST", "/v1/completions", json={**body, "prompt": [5] * 1995, "stream": True}) as streamed:
        assert streamed.status_code == 200
        chunks = [json.loads(line[6:]) for line in streamed.iter_lines() if line.startswith("data: {")]
    assert not any("error" in c for c in chunks), chunks[-1]
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"


def test_a_stateless_streamed_turn_runs_on_an_ephemeral_session_no_directory_lists(server) -> None:
    """Without an X-Session-Id a streamed chat turn is one call to the backend on an ephemeral
    session, opened and closed by that call: while it streams, no session of it is in the
    directory the sessions routes list (nor afterwards). (A long reply: the connection's buffers
    would take a short one whole before the listing is asked for.)"""
    http = server.http()
    before = {s["id"] for s in http.get("/v1/sessions").json()["data"]}
    body = {"model": server.model, "messages": [{"role": "user", "content": "Tell me a long story."}],
            "max_tokens": 1900, "temperature": 0, "ignore_eos": True, "stream": True, **TEXT_ONLY}
    with http.stream("POST", "/v1/chat/completions", json=body) as r:
        assert r.status_code == 200, r.read()
        lines = r.iter_lines()
        next(line for line in lines if line.startswith("data: {") and '"content": "' in line
             and '"content": ""' not in line)
        during = {s["id"] for s in server.http().get("/v1/sessions").json()["data"]}
        rest = list(lines)
    assert during - before == set()
    assert [line for line in rest if line][-1] == "data: [DONE]"
    pieces = [json.loads(line[6:]) for line in rest if line.startswith("data: {")]
    assert any(p["choices"] and p["choices"][0]["finish_reason"] == "length" for p in pieces)
    assert {s["id"] for s in http.get("/v1/sessions").json()["data"]} - before == set()
