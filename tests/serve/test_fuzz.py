"""Malformed requests never get a 500: each is a 4xx whose error body names the problem. A fixed
list of cases (each with a word the message or ``param`` must carry), then random JSON bodies
drawn by hypothesis."""

from __future__ import annotations

import json

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.hypothesis_profiles import examples

MSG = [{"role": "user", "content": "hi"}]


def _cases(model: str) -> list[tuple[str, str, object, dict, str]]:
    """(method, path, body (bytes, or a JSON value), headers, a word the answer must name)."""
    chat = "/v1/chat/completions"
    ok = {"model": model, "messages": MSG, "max_tokens": 2}
    return [
        ("POST", chat, b"", {}, "empty"),
        ("POST", chat, b"{not json", {}, "JSON"),
        ("POST", chat, b"\xff\xfe\x00", {}, "JSON"),
        ("POST", chat, [1, 2, 3], {}, "object"),
        ("POST", chat, "just a string", {}, "object"),
        ("POST", chat, {"messages": MSG}, {}, "model"),
        ("POST", chat, {"model": model}, {}, "messages"),
        ("POST", chat, {"model": model, "messages": []}, {}, "messages"),
        ("POST", chat, {"model": model, "messages": "hello"}, {}, "messages"),
        ("POST", chat, {"model": model, "messages": [{"role": "wizard", "content": "x"}]}, {}, "role"),
        ("POST", chat, {"model": model, "messages": [{"role": "user"}]}, {}, "content"),
        ("POST", chat, {"model": model, "messages": [{"role": "user", "content": 5}]}, {}, "content"),
        ("POST", chat, {"model": model, "messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, {},
         "content"),
        ("POST", chat, {"model": 12, "messages": MSG}, {}, "model"),
        ("POST", chat, {"model": "nope", "messages": MSG}, {}, "model"),
        ("POST", chat, {**ok, "max_tokens": -1}, {}, "max_tokens"),
        ("POST", chat, {**ok, "max_tokens": "ten"}, {}, "max_tokens"),
        ("POST", chat, {**ok, "max_tokens": 10**9}, {}, "max_tokens"),
        ("POST", chat, {**ok, "max_tokens": 2.5}, {}, "max_tokens"),
        ("POST", chat, {**ok, "temperature": -1}, {}, "temperature"),
        ("POST", chat, {**ok, "temperature": "hot"}, {}, "temperature"),
        ("POST", chat, {**ok, "top_p": 0}, {}, "top_p"),
        ("POST", chat, {**ok, "frequency_penalty": 9}, {}, "frequency_penalty"),
        ("POST", chat, {**ok, "presence_penalty": "x"}, {}, "presence_penalty"),
        ("POST", chat, {**ok, "n": 9}, {}, "n"),
        ("POST", chat, {**ok, "n": 0}, {}, "n"),
        ("POST", chat, {**ok, "stop": [""]}, {}, "stop"),
        ("POST", chat, {**ok, "stop": ["a"] * 40}, {}, "stop"),
        ("POST", chat, {**ok, "stop": 7}, {}, "stop"),
        ("POST", chat, {**ok, "seed": "abc"}, {}, "seed"),
        ("POST", chat, {**ok, "stream": "yes"}, {}, "stream"),
        ("POST", chat, {**ok, "logit_bias": {"5": 101}}, {}, "logit_bias"),
        ("POST", chat, {**ok, "logit_bias": {"five": 1}}, {}, "five"),
        ("POST", chat, {**ok, "logit_bias": {"-3": 1}}, {}, "-3"),
        ("POST", chat, {**ok, "logit_bias": {"99999999": 1}}, {}, "99999999"),
        ("POST", chat, {**ok, "logit_bias": {"5": "up"}}, {}, "logit_bias"),
        ("POST", chat, {**ok, "tools": "f"}, {}, "tools"),
        ("POST", chat, {**ok, "tools": [{"type": "function", "function": {"name": "f g"}}]}, {}, "tools[0].function.name"),
        ("POST", chat, {**ok, "tools": [{"type": "retrieval"}]}, {}, "tools[0].type"),
        ("POST", chat, {**ok, "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": 3}}}]},
         {}, "parameters"),
        ("POST", chat, {**ok, "tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": "always"}, {},
         "tool_choice"),
        ("POST", chat, {**ok, "tools": [{"type": "function", "function": {"name": "f"}}],
                        "tool_choice": {"type": "function", "function": {"name": "g"}}}, {}, "tool_choice"),
        ("POST", chat, {**ok, "tool_choice": "required"}, {}, "tool_choice"),
        ("POST", chat, {**ok, "functions": [{"name": "f"}]}, {}, "functions"),
        ("POST", chat, {**ok, "messages": [*MSG, {"role": "tool", "content": "5"}]}, {}, "tool_call_id"),
        ("POST", chat, {**ok, "messages": [*MSG, {"role": "tool", "tool_call_id": "c9", "content": "5"}]}, {},
         "tool_call_id"),
        ("POST", chat, {**ok, "messages": [{"role": "user", "content": "x", "tool_calls": []}]}, {}, "tool_calls"),
        ("POST", chat, {**ok, "messages": [*MSG, {"role": "assistant", "content": None}]}, {}, "content"),
        ("POST", chat, {**ok, "messages": [*MSG, {"role": "assistant", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "[1]"}}]}]}, {}, "arguments"),
        ("POST", chat, {**ok, "messages": [*MSG, {"role": "assistant", "tool_calls": [
            {"id": "", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}]}, {}, "id"),
        ("POST", chat, {**ok, "top_logprobs": 5}, {}, "top_logprobs"),
        ("POST", chat, {**ok, "logprobs": True, "top_logprobs": 21}, {}, "top_logprobs"),
        ("POST", chat, {**ok, "logprobs": True, "top_logprobs": "5"}, {}, "top_logprobs"),
        ("POST", chat, {**ok, "response_format": {"type": "xml"}}, {}, "response_format"),
        ("POST", chat, {**ok, "response_format": {"type": "json_schema"}}, {}, "json_schema"),
        ("POST", chat, {**ok, "grammar": "root ::= [a-z"}, {}, "grammar"),
        ("POST", chat, {**ok, "grammar": "root ::= [a-z]+", "response_format": {"type": "json_object"}}, {},
         "grammar"),
        ("POST", chat, {**ok, "top_k": -3}, {}, "top_k"),
        ("POST", chat, {**ok, "min_p": 1.5}, {}, "min_p"),
        ("POST", chat, {**ok, "stop_token_ids": [-1]}, {}, "stop_token_ids"),
        ("POST", chat, {**ok, "unknown_field": 1}, {}, "unknown_field"),
        ("POST", chat, ok, {"X-Session-Id": "../../etc/passwd"}, "session"),
        ("POST", chat, ok, {"X-Session-Id": "x" * 300}, "session"),
        ("POST", "/v1/completions", {"model": model, "prompt": ""}, {}, "prompt"),
        ("POST", "/v1/completions", {"model": model, "prompt": ["a", "b"]}, {}, "prompt"),
        ("POST", "/v1/completions", {"model": model, "prompt": [1, -5]}, {}, "prompt"),
        ("POST", "/v1/completions", {"model": model, "prompt": [10**9]}, {}, "token"),
        ("POST", "/v1/completions", {"model": model, "prompt": "x", "logprobs": 6}, {}, "logprobs"),
        ("POST", "/v1/completions", {"model": model, "prompt": "x", "logit_bias": {"1": -101}}, {}, "logit_bias"),
        ("POST", "/v1/completions", {"model": model, "prompt": "x", "suffix": "y"}, {}, "suffix"),
        ("POST", "/v1/completions", {"model": model, "prompt": "x", "best_of": 4}, {}, "best_of"),
        ("POST", "/v1/responses", {"model": model}, {}, "input"),
        ("POST", "/v1/responses", {"model": model, "input": []}, {}, "input"),
        ("POST", "/v1/responses", {"model": model, "input": [{"type": "function_call", "name": "f"}]}, {}, "input"),
        ("POST", "/v1/responses", {"model": model, "input": [{"type": "function_call_output", "call_id": "c1",
                                                             "output": "5"}]}, {}, "call_id"),
        ("POST", "/v1/responses", {"model": model, "input": [{"type": "function_call", "call_id": "c1", "name": "f",
                                                             "arguments": "nope"}]}, {}, "arguments"),
        ("POST", "/v1/responses", {"model": model, "input": "x", "tools": [{"type": "function", "name": ""}]}, {},
         "tools[0].name"),
        ("POST", "/v1/responses", {"model": model, "input": "x", "tools": [{"type": "web_search"}]}, {},
         "tools[0].type"),
        ("POST", "/v1/responses", {"model": model, "input": "x", "tools": [{"type": "function", "name": "f"}],
                                   "tool_choice": {"type": "function", "name": "g"}}, {}, "tool_choice"),
        ("POST", "/v1/responses", {"model": model, "input": "x", "previous_response_id": "resp_nope"}, {},
         "previous_response_id"),
        ("POST", "/v1/responses", {"model": model, "input": "x", "max_output_tokens": -4}, {}, "max_output_tokens"),
        ("POST", "/v1/responses", {"model": model, "input": "x", "background": True}, {}, "background"),
        ("POST", "/v1/responses", {"model": model, "input": "x", "text": {"format": {"type": "yaml"}}}, {}, "text"),
        ("POST", "/v1/responses", {"model": model, "input": "x", "truncation": "auto"}, {}, "truncation"),
        ("POST", "/v1/responses", {"model": model, "input": "x", "top_logprobs": 21}, {}, "top_logprobs"),
        ("POST", "/v1/responses", {"model": model, "input": "x", "logit_bias": {"a": 1}}, {}, "logit_bias"),
        ("GET", "/v1/responses/resp_missing/input_items", None, {}, "resp_missing"),
        ("GET", "/v1/responses/resp_missing/input_items?limit=0", None, {}, "limit"),
        ("GET", "/v1/responses/resp_missing/input_items?order=sideways", None, {}, "order"),
        ("GET", "/v1/responses/resp_missing", None, {}, "resp_missing"),
        ("DELETE", "/v1/responses/resp_missing", None, {}, "resp_missing"),
        ("GET", "/v1/sessions/no-such-session", None, {}, "no-such-session"),
        ("GET", "/v1/sessions/bad%20id!", None, {}, "session"),
        ("DELETE", "/v1/sessions/no-such-session", None, {}, "no-such-session"),
        ("POST", "/v1/sessions/no-such-session/suspend", None, {}, "no-such-session"),
        ("POST", "/v1/sessions/no-such-session/fork", {"new_id": 5}, {}, "new_id"),
        ("POST", "/v1/sessions/no-such-session/rollback", {"count": "two"}, {}, "count"),
        ("POST", "/v1/sessions/no-such-session/explode", None, {}, "explode"),
        ("POST", "/v1/sessions/s-new/restore", b"garbage bytes", {}, "session"),
        ("GET", "/v1/models/nope", None, {}, "nope"),
        ("GET", "/v1/nowhere", None, {}, "nowhere"),
    ]


def _send(http: httpx.Client, method: str, path: str, body: object, headers: dict) -> httpx.Response:
    if body is None:
        return http.request(method, path, headers=headers)
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    return http.request(method, path, content=content, headers={"Content-Type": "application/json", **headers})


def test_malformed_requests_get_a_4xx_that_names_the_problem(server) -> None:
    cases = _cases(server.model)
    assert len(cases) >= 30
    failures = []
    with server.http() as http:
        for method, path, body, headers, word in cases:
            r = _send(http, method, path, body, headers)
            error = r.json().get("error", {}) if r.headers.get("content-type", "").startswith("application/json") else {}
            named = word.lower() in (str(error.get("message", "")) + " " + str(error.get("param", ""))).lower()
            if not 400 <= r.status_code < 500 or not named:
                failures.append((method, path, str(body)[-120:], r.status_code, r.text[:300]))
    assert not failures, "\n".join(map(str, failures))


JSON = st.recursive(st.none() | st.booleans() | st.integers(-10**12, 10**12) | st.floats(allow_nan=True)
                    | st.text(max_size=20), lambda inner: st.lists(inner, max_size=4)
                    | st.dictionaries(st.text(max_size=12), inner, max_size=4), max_leaves=12)
FIELDS = st.sampled_from(["model", "messages", "max_tokens", "temperature", "top_p", "stop", "seed", "stream",
                          "n", "response_format", "logprobs", "frequency_penalty", "input", "prompt", "top_k",
                          "tools", "tool_choice", "parallel_tool_calls", "top_logprobs", "logit_bias"])


@pytest.mark.slow
def test_random_bodies_never_get_a_500(server) -> None:
    http = server.http()

    @settings(max_examples=examples(60), deadline=None, suppress_health_check=list(HealthCheck))
    @given(path=st.sampled_from(["/v1/chat/completions", "/v1/completions", "/v1/responses"]),
           body=st.dictionaries(FIELDS, JSON, max_size=6))
    def check(path: str, body: dict) -> None:
        body.setdefault("max_tokens", 2)
        _answers_without_a_500(http, path, body)

    check()


def _answers_without_a_500(http: httpx.Client, path: str, body: dict) -> None:
    """``body`` posted as JSON (NaN allowed): an answer, or a 4xx whose error says what is wrong."""
    r = http.post(path, content=json.dumps(body, allow_nan=True).encode(), headers={"Content-Type": "application/json"})
    assert r.status_code < 500, (path, body, r.status_code, r.text[:300])
    if r.status_code >= 400:
        assert r.json()["error"]["message"]


NEW_FIELDS = st.fixed_dictionaries({}, optional={
    "n": st.integers(-2, 10) | JSON,
    "logprobs": st.booleans() | JSON,
    "top_logprobs": st.integers(-2, 25) | JSON,
    "logit_bias": st.dictionaries(st.integers(-5, 70000).map(str) | st.text(max_size=6),
                                  st.integers(-150, 150) | st.floats(allow_nan=True) | JSON, max_size=3) | JSON,
    "stream": st.booleans(),
    "temperature": st.sampled_from([0, 1.0]),
})


@pytest.mark.slow
def test_the_agent_fields_never_get_a_500(server) -> None:
    """``n``, ``logprobs`` / ``top_logprobs`` and ``logit_bias`` drawn around and past their limits,
    on requests that are otherwise valid: a 4xx naming the problem, or an answer."""
    http = server.http()

    @settings(max_examples=examples(30), deadline=None, suppress_health_check=list(HealthCheck))
    @given(path=st.sampled_from(["/v1/chat/completions", "/v1/completions", "/v1/responses"]), fields=NEW_FIELDS)
    def check(path: str, fields: dict) -> None:
        body = {"model": server.model, "max_tokens": 2, **fields}
        if path == "/v1/chat/completions":
            body["messages"] = MSG
        elif path == "/v1/completions":
            body["prompt"] = "Once"
        else:
            body = {"model": server.model, "input": "hi", "max_output_tokens": 2, **fields}
        _answers_without_a_500(http, path, body)

    check()
