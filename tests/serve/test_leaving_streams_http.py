"""A streaming HTTP client that disconnects mid-reply (issue #49): the backend's stream ends, and the
session keeps exactly its prompt and the first tokens of the reply the turn would have given, at
least those whose text the client read and never more than the front sent; the session takes its
next turn at once. A real ``kvres serve`` with a llama.cpp backend ("l0") and an OpenVINO one
("o0") on the served chat model, an ``httpx`` client closed mid-stream."""

from __future__ import annotations

import json
import secrets
import time
import uuid
from collections.abc import Iterator

import httpx
import pytest

from .conftest import Server, free_port, start_server, stop_server, wait_healthy

MESSAGES = [{"role": "user", "content": "Go on and on."}]
MAX_TOKENS = 300
ENGINES = {"l0": "llama", "o0": "openvino"}


@pytest.fixture(scope="module")
def engines(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    backends: list[dict[str, object]] = [
        {"name": name, "engine": engine, "n_ctx": 2048, "n_seq_max": 4, "kv_budget_tokens": 2000, "n_threads": 1}
        for name, engine in ENGINES.items()]
    srv = start_server(tmp_path_factory.mktemp("serve-engines"), free_port(), key=f"test-key-{secrets.token_hex(16)}",
                       backends=backends)
    wait_healthy(srv, timeout_s=120)
    yield srv
    stop_server(srv)


def _read_pieces(response: httpx.Response, count: int) -> str:
    text, n = "", 0
    for line in response.iter_lines():
        if line.startswith("data: {"):
            piece = json.loads(line[6:])["choices"][0]["delta"].get("content")
            if piece:
                text, n = text + piece, n + 1
                if n >= count:
                    break
    return text


@pytest.mark.parametrize("backend", ENGINES)
def test_a_client_that_disconnects_leaves_its_session_what_was_sent(engines: Server, backend: str) -> None:
    http = engines.http()
    body = {"model": backend, "messages": MESSAGES, "max_tokens": MAX_TOKENS, "temperature": 0, "ignore_eos": True}
    whole_id, left_id = (f"{kind}-{backend}-{uuid.uuid4().hex[:8]}" for kind in ("whole", "left"))
    whole = http.post("/v1/chat/completions", json=body, headers={"X-Session-Id": whole_id})
    assert whole.status_code == 200, whole.text
    prompt = whole.json()["usage"]["prompt_tokens"]
    reply = whole.json()["choices"][0]["message"]["content"]
    want = http.get(f"/v1/sessions/{whole_id}/tokens").json()["tokens"]
    assert len(want) == prompt + MAX_TOKENS  # the turn run to its end, on a session of its own

    with http.stream("POST", "/v1/chat/completions", json={**body, "stream": True},
                     headers={"X-Session-Id": left_id}) as stream:
        assert stream.status_code == 200
        received = _read_pieces(stream, 3)
    assert received and reply.startswith(received)  # what the client read is the reply's beginning

    deadline = time.monotonic() + 60
    while (r := http.post(f"/v1/sessions/{left_id}/rollback", json={"count": 0})).status_code == 409:
        assert time.monotonic() < deadline, "the hold of a stream its client left was never released"
        time.sleep(0.1)
    assert r.status_code == 200, r.text
    log = http.get(f"/v1/sessions/{left_id}/tokens").json()
    kept = len(log["tokens"]) - prompt
    assert log["tokens"] == want[:prompt + kept]  # the prompt and the reply's first tokens, nothing else
    assert 3 <= kept < MAX_TOKENS  # at least what was read; the reply stopped when its client left
    stats = http.get(f"/v1/sessions/{left_id}").json()
    assert stats["token_count"] == prompt + kept
    follow = http.post("/v1/chat/completions", headers={"X-Session-Id": left_id}, json={
        **body, "max_tokens": 4, "messages": MESSAGES + [{"role": "user", "content": "And then?"}]})
    assert follow.status_code == 200, follow.text  # the session takes its next turn at once
    for sid in (whole_id, left_id):
        http.delete(f"/v1/sessions/{sid}")
