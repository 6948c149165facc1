"""Sessions keep their KV across tool pauses, through a real ``kvres serve`` and the ``openai`` client:
a bound turn that ends in tool calls pauses its session (``paused_for_tools`` in its stats, on chat
completions whole and streamed and on Responses) until the turn carrying the results; 16 agent
sessions over 4 sequence slots and a small KV budget, whose tools take 2 s each, prefill only the
result and the next user message on every result turn, and no session paused for tools is parked
while an idle one could be.

Its own server: one backend of the served (default) model, ``n_seq_max=4`` and a KV budget of about
three agents' conversations (an agent's is about 90 tokens when it calls, 130 after its result
turn), so that slots and room both make the backend park sessions."""

from __future__ import annotations

import secrets
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from .conftest import Server, free_port, start_server, stop_server, wait_healthy

AGENTS = 16
SLOTS = 4
PAUSED_AT_ONCE = SLOTS - 2  # with one turn running, an idle session always holds one of the other slots
TOOL_S = 2.0  # how long each tool "takes": the client waits that long before sending its result
CHAT_TURNS = 2  # plain turns an agent's user has after its tool round trip
CITIES = ("Paris", "Oslo", "Lima", "Cairo", "Quito", "Perth", "Tokyo", "Rome")
LOOKUP = {"type": "object", "properties": {"city": {"type": "string", "enum": list(CITIES)}}, "required": ["city"]}
TOOLS = [{"type": "function", "function": {"name": "weather", "description": "The weather in a city",
                                           "parameters": LOOKUP}}]


@pytest.fixture(scope="module")
def pause_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    config = {"backends": [{"name": "b0", "n_ctx": 1024, "n_seq_max": SLOTS, "kv_budget_tokens": 480,
                            "n_threads": 1}]}
    server = start_server(tmp_path_factory.mktemp("tool-pauses"), free_port(), key=f"test-key-{secrets.token_hex(16)}",
                          config=config, replicas=1)
    wait_healthy(server)
    yield server
    stop_server(server)


def _stats(server: Server, session: str) -> dict[str, Any]:
    with server.http() as http:
        answer = http.get(f"/v1/sessions/{session}")
        assert answer.status_code == 200, answer.text
        return dict(answer.json())


def _user(i: int) -> dict[str, str]:
    return {"role": "user", "content": f"What is the weather in {CITIES[i % len(CITIES)]}?"}


def _chat(server: Server, session: str, messages: list[dict[str, Any]], streamed: bool,
          **kwargs: Any) -> tuple[dict[str, Any], list[dict[str, Any]], dict[str, Any]]:
    """One bound turn: (its assistant message as the next turn sends it back, its calls, its usage)."""
    client = server.client()
    common = {"model": server.model, "messages": messages, "tools": TOOLS, "temperature": 0.0, **kwargs}
    headers = {"X-Session-Id": session}
    if not streamed:
        reply = client.chat.completions.create(extra_headers=headers, **common)
        calls = [c.model_dump() for c in reply.choices[0].message.tool_calls or ()]
        text = reply.choices[0].message.content
        assert reply.usage is not None
        usage = reply.usage.model_dump()
    else:
        parts: dict[int, dict[str, Any]] = {}
        usage, text = {}, ""
        for chunk in client.chat.completions.create(extra_headers=headers, stream=True,
                                                    stream_options={"include_usage": True}, **common):
            if chunk.usage is not None:
                usage = chunk.usage.model_dump()
            delta = chunk.choices[0].delta if chunk.choices else None
            text += (delta.content or "") if delta is not None else ""
            for part in (delta.tool_calls or ()) if delta is not None else ():
                call = parts.setdefault(part.index, {"id": "", "type": "function",
                                                     "function": {"name": "", "arguments": ""}})
                call["id"] += part.id or ""
                if part.function is not None:
                    call["function"]["name"] += part.function.name or ""
                    call["function"]["arguments"] += part.function.arguments or ""
        calls = [parts[i] for i in sorted(parts)]
    if calls:
        return {"role": "assistant", "content": text or None, "tool_calls": calls}, calls, usage
    return {"role": "assistant", "content": text or ""}, calls, usage


def test_a_turn_that_ends_in_calls_pauses_its_session_until_the_results(pause_server: Server) -> None:
    for streamed in (False, True):
        session = f"pause-{uuid.uuid4().hex[:8]}"
        message, calls, _ = _chat(pause_server, session, [_user(0)], streamed, max_tokens=120,
                                  tool_choice={"type": "function", "function": {"name": "weather"}})
        assert calls
        assert _stats(pause_server, session)["paused_for_tools"]  # told before the answer went out
        results = [{"role": "tool", "tool_call_id": c["id"], "content": "sunny"} for c in calls]
        _chat(pause_server, session, [_user(0), message, *results], streamed, max_tokens=4, tool_choice="none")
        assert not _stats(pause_server, session)["paused_for_tools"]
    # Responses: a stored response that ended in calls pauses its chain's session
    with pause_server.http() as http:
        body = {"model": pause_server.model, "input": "What is the weather in Oslo?", "max_output_tokens": 120,
                "tools": [{"type": "function", **TOOLS[0]["function"]}], "temperature": 0.0,
                "tool_choice": {"type": "function", "name": "weather"}}
        answer = http.post("/v1/responses", json=body)
        assert answer.status_code == 200, answer.text
        response = answer.json()
    assert any(item["type"] == "function_call" for item in response["output"])
    assert _stats(pause_server, response["kvres"]["session_id"])["paused_for_tools"]


def test_sixteen_agents_over_four_slots_keep_their_kv_across_two_second_tools(pause_server: Server) -> None:
    """Each agent: a turn forced to call the tool, the tool's 2 s, then the result and the next user
    message, then a few plain turns of chat (the user reading on). Turns go one at a time and at most
    ``PAUSED_AT_ONCE`` agents wait for a tool at once, so whenever the backend needs a slot or room an
    idle session is there to give it; the chatting ones were used more recently than those waiting
    for a tool, so recency alone would park the waiting ones: they must not be the ones parked."""
    turn_lock = threading.Lock()  # one turn at a time: the other slots are held by idle or paused sessions
    pauses = threading.Semaphore(PAUSED_AT_ONCE)
    failures: list[str] = []
    results: dict[int, tuple[int, dict[str, Any]]] = {}  # agent -> (tokens held before its result, that turn's usage)
    sessions = [f"agent-{i}-{uuid.uuid4().hex[:6]}" for i in range(AGENTS)]

    def agent(i: int) -> None:
        session, streamed = sessions[i], i % 2 == 1
        try:
            with pauses:
                with turn_lock:
                    message, calls, _ = _chat(pause_server, session, [_user(i)], streamed, max_tokens=120,
                                              tool_choice={"type": "function", "function": {"name": "weather"}})
                assert calls, f"agent {i}: no call"
                held = int(_stats(pause_server, session)["token_count"])  # all the session holds before the result
                time.sleep(TOOL_S)  # the tool runs; other agents' turns go on
                history = [_user(i), message, *({"role": "tool", "tool_call_id": c["id"], "content": "sunny, 21 C"}
                                                for c in calls), {"role": "user", "content": "Thanks. Is that warm?"}]
                with turn_lock:
                    reply, _, usage = _chat(pause_server, session, history, streamed, max_tokens=8,
                                            tool_choice="none")
            results[i] = (held, usage)
            for k in range(CHAT_TURNS):  # idle between turns, and more recently used than the paused agents
                time.sleep(0.3)
                history += [reply, _user(i + k + 1)]
                with turn_lock:
                    reply, _, _ = _chat(pause_server, session, history, streamed, max_tokens=4, tool_choice="none")
        except Exception as exc:  # every failure is reported below
            failures.append(f"agent {i}: {type(exc).__name__}: {exc}")

    threads = [threading.Thread(target=agent, args=(i,)) for i in range(AGENTS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not failures, failures
    assert sorted(results) == list(range(AGENTS))
    for i, (held, usage) in results.items():
        cached = usage["prompt_tokens_details"]["cached_tokens"]
        assert cached == held, f"agent {i}: the result turn prefilled {held - cached} tokens it held"
        assert usage["prompt_tokens"] - cached > 0  # the result and the next user message
    final = {sessions[i]: _stats(pause_server, sessions[i])["counters"] for i in range(AGENTS)}
    assert sum(c["suspends"] for c in final.values()) >= AGENTS - SLOTS, final  # the backend parked sessions
    assert {sid: c["tool_pause_suspends"] for sid, c in final.items() if c["tool_pause_suspends"]} == {}
