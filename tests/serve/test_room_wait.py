"""Turns wait for room instead of being refused, through a real ``kvres serve`` and the ``openai``
client: a burst of chat turns whose sessions together outgrow the backend's KV budget all complete
(no 429), and a turn that cannot get room within the backend's ``max_room_wait_s`` is a 429 with
``Retry-After``.

Its own server, of two backends of the served model: ``small`` (a 512-token budget, where no pin
holds) and ``pinning`` (a 256-token budget that pinned sessions may fill, ``max_room_wait_s=1``);
every session is opened pinned (``default_policy``)."""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Iterator

import openai
import pytest

from .conftest import Server, free_port, start_server, stop_server, wait_healthy

BURST = 8


@pytest.fixture(scope="module")
def room_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    common = {"n_ctx": 1024, "n_seq_max": 8, "n_threads": 1}
    config = {
        "backends": [
            {"name": "small", **common, "kv_budget_tokens": 512, "max_pinned_tokens": 0},
            {"name": "pinning", **common, "kv_budget_tokens": 256, "max_pinned_tokens": 256, "max_room_wait_s": 1.0},
        ],
        "default_policy": {"pin": True},
    }
    server = start_server(tmp_path_factory.mktemp("room"), free_port(), key=f"test-key-{secrets.token_hex(16)}",
                          config=config, replicas=1)
    wait_healthy(server)
    yield server
    stop_server(server)


def _words(seed: int, n: int) -> str:
    return " ".join(("cat", "dog", "sun", "tree", "house", "day", "big", "little")[(seed + k * k) % 8] for k in range(n))


def _turn(client: openai.OpenAI, backend: str, session: str, words: int, seed: int, max_tokens: int = 16) -> str:
    reply = client.chat.completions.create(
        model=backend, messages=[{"role": "user", "content": _words(seed, words)}], max_tokens=max_tokens,
        temperature=0, extra_body={"ignore_eos": True}, extra_headers={"X-Session-Id": session})
    return reply.choices[0].message.content or ""


def test_a_burst_past_the_budget_completes_without_a_429(room_server: Server) -> None:
    """Eight conversations start at once on a 512-token backend, each turn about 100 tokens of
    prompt and 16 of reply (more than 900 together): the turns that find no room wait for it, and
    every one is answered."""
    client = room_server.client()
    failures: list[str] = []
    answers: list[str] = []
    start = threading.Barrier(BURST)

    def conversation(i: int) -> None:
        try:
            start.wait(timeout=60)
            answers.append(_turn(client, "small", f"burst-{i}", 90, i))
        except Exception as exc:  # every failure is reported below
            failures.append(f"{type(exc).__name__}: {exc}")

    threads = [threading.Thread(target=conversation, args=(i,)) for i in range(BURST)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    assert not failures, failures
    assert len(answers) == BURST
    with room_server.http() as http:
        lengths = [http.get(f"/v1/sessions/burst-{i}").json()["token_count"] for i in range(BURST)]
        for i in range(BURST):
            assert http.delete(f"/v1/sessions/burst-{i}").status_code == 200
    assert min(lengths) > 100 and sum(lengths) > 512


def test_past_the_wait_a_turn_is_a_429_with_retry_after(room_server: Server) -> None:
    """On ``pinning``, a pinned conversation holds most of the 256-token budget: a second one's
    turn cannot get room, waits ``max_room_wait_s`` (1 s) and is refused, a 429 whose
    ``Retry-After`` says when to try again; once the first conversation is closed it is answered."""
    client = room_server.client()
    _turn(client, "pinning", "holder-1", 150, 1, max_tokens=4)  # about 200 tokens of the 256
    started = time.monotonic()
    with pytest.raises(openai.RateLimitError) as refused:
        _turn(client, "pinning", "waiter-1", 60, 2)
    waited = time.monotonic() - started
    response = refused.value.response
    assert response.status_code == 429 and int(response.headers["retry-after"]) >= 1
    error = response.json()["error"]
    assert error["code"] == "backend_full" and "max_room_wait_s=1" in error["message"], error
    assert waited >= 1.0  # it waited for room before it was refused
    with room_server.http() as http:
        assert http.delete("/v1/sessions/holder-1").status_code == 200
        assert _turn(client, "pinning", "waiter-1", 60, 2)
        assert http.delete("/v1/sessions/waiter-1").status_code == 200
