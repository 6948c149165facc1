"""One streamed turn over HTTP, as a soak client sends it, and how it can end.

Primitives:
- ``chat_turn(client, model, messages, session_id, max_tokens) -> Answer``: ``POST
  /v1/chat/completions`` bound to ``session_id`` (``X-Session-Id``), greedy, streamed, usage asked
  for, the reply in plain text (``PLAIN_TEXT``, a grammar: no control token).
- ``responses_turn(client, model, text, previous_id, max_tokens) -> Answer``: ``POST
  /v1/responses`` continuing from ``previous_id`` (None: a new chain), stored, greedy, streamed,
  in plain text.
- ``Answer``: the reply's text as the client received it (every text delta), ``finish`` ("stop":
  the model's end of generation, whose token the session's log holds after the text; "length":
  ``max_tokens``), the prompt, cached and completion tokens the server counted, ``length`` (the
  session's log length after the turn: prompt + completion), ``first_token_at`` (monotonic),
  ``response_id`` and ``session_id`` (a Responses turn: the session it ran on).
- The ways a turn does not complete: ``Refused(status, code)``: the server answered 429
  (``backend_full``, ``tenant_quota``) or 409 (``session_busy``: another request holds the
  session) before running anything: the client waits and sends it again; ``Unreachable``: no
  server answered (connection refused, or cut before any answer: a kept-alive connection the
  server had closed, or a server that died after taking it, ``maybe_taken``): sent again too; ``TurnFailed(status, code, message)``: the server took it and
  it failed (an error status, an error event, or the stream cut before its end): the one retry.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

REFUSALS = {429: ("backend_full", "tenant_quota", None), 409: ("session_busy",)}
# Replies in plain text: a control token the model samples (its chat template's role markers) is in
# the session's log but reads as nothing in the text a client receives, so the client could not say
# what it received; the grammar keeps them out (the model still ends a reply with its EOS).
PLAIN_TEXT = "root ::= [a-zA-Z0-9 .,?!+-]+"


@dataclass(frozen=True)
class Answer:
    text: str
    finish: str
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    first_token_at: float | None
    response_id: str | None = None
    session_id: str | None = None
    prefix_break: dict[str, Any] | None = None  # a bound chat turn's ``kvres.prefix_break``

    @property
    def length(self) -> int:
        return self.prompt_tokens + self.completion_tokens


class TurnError(Exception):
    def __init__(self, message: str, status: int | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.code = status, code


class Refused(TurnError):
    """Answered with a refusal before anything ran: send it again later."""


class Unreachable(TurnError):
    """No server answered: refused at connect (``maybe_taken`` False), or the connection was cut
    before any answer (True: a closed kept-alive connection, or a server that took the request
    and died before answering)."""

    def __init__(self, message: str, maybe_taken: bool = False) -> None:
        super().__init__(message)
        self.maybe_taken = maybe_taken


class TurnFailed(TurnError):
    """The server took the request and the turn failed."""


def _error_of(status: int, raw: bytes) -> TurnError:
    try:
        error = json.loads(raw).get("error") or {}
    except (ValueError, AttributeError):
        error = {}
    code = error.get("code") if isinstance(error, dict) else None
    message = f"HTTP {status} {code or ''}: {(error.get('message') if isinstance(error, dict) else None) or raw[:200]!r}"
    if code in REFUSALS.get(status, ()):
        return Refused(message, status, code)
    return TurnFailed(message, status, code)


def _events(client: Any, path: str, body: dict[str, Any], headers: dict[str, str]) -> Iterator[dict[str, Any]]:
    """The JSON events of a streamed answer; ``[DONE]`` as ``{"done": True}``. Each way it can fail
    is raised as a ``TurnError``."""
    import httpx

    answered = False
    try:
        with client.stream("POST", path, json=body, headers=headers) as r:
            answered = True
            if r.status_code != 200:
                raise _error_of(r.status_code, r.read())
            for line in r.iter_lines():
                if line == "data: [DONE]":
                    yield {"done": True}
                elif line.startswith("data: {"):
                    yield json.loads(line[6:])
    except httpx.ConnectError as exc:
        raise Unreachable(f"{type(exc).__name__}: {exc}") from exc
    except (httpx.RemoteProtocolError, httpx.ReadError) as exc:
        if not answered:  # gone before any answer: a closed kept-alive connection, or a server that died
            raise Unreachable(f"{type(exc).__name__}: {exc}", maybe_taken=True) from exc
        raise TurnFailed(f"the stream was cut: {type(exc).__name__}: {exc}") from exc
    except httpx.TimeoutException as exc:
        raise TurnFailed(f"{type(exc).__name__}: {exc}") from exc


def chat_turn(client: Any, model: str, messages: list[dict[str, str]], session_id: str, max_tokens: int) -> Answer:
    body = {"model": model, "messages": messages, "max_tokens": max_tokens, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}, "grammar": PLAIN_TEXT}
    text, finish, usage, first, done, kvres = "", None, None, None, False, None
    for event in _events(client, "/v1/chat/completions", body, {"X-Session-Id": session_id}):
        if event.get("done"):
            done = True
            break
        if "error" in event:
            error = event["error"] or {}
            raise TurnFailed(f"error event: {error}", None, error.get("code"))
        usage = event.get("usage") or usage
        kvres = event.get("kvres") or kvres
        for choice in event.get("choices", []):
            piece = (choice.get("delta") or {}).get("content")
            if piece:
                first = first or time.monotonic()
                text += piece
            finish = choice.get("finish_reason") or finish
    if not done or usage is None or finish is None:
        raise TurnFailed(f"the stream ended without its {'usage' if done else '[DONE]'}")
    details = usage.get("prompt_tokens_details") or {}
    return Answer(text, finish, int(usage["prompt_tokens"]), int(details.get("cached_tokens", 0)),
                  int(usage["completion_tokens"]), first, prefix_break=(kvres or {}).get("prefix_break"))


def responses_turn(client: Any, model: str, text: str, previous_id: str | None, max_tokens: int) -> Answer:
    body: dict[str, Any] = {"model": model, "input": text, "max_output_tokens": max_tokens, "temperature": 0,
                            "stream": True, "store": True, "grammar": PLAIN_TEXT}
    if previous_id is not None:
        body["previous_response_id"] = previous_id
    received, first = "", None
    for event in _events(client, "/v1/responses", body, {}):
        kind = event.get("type")
        if kind == "response.output_text.delta":
            if event.get("delta"):
                first = first or time.monotonic()
                received += event["delta"]
        elif kind == "response.failed":
            error = (event.get("response") or {}).get("error") or {}
            raise TurnFailed(f"response.failed: {error}", None, error.get("code"))
        elif kind in ("response.completed", "response.incomplete"):
            final = event["response"]
            usage = final["usage"]
            kvres = final.get("kvres") or {}
            output = final["output"][0]["content"][0]["text"] if final.get("output") else ""
            if output != received:
                raise TurnFailed(f"the final text {output!r} is not the deltas' {received!r}")
            answer = Answer(received, "stop" if kind == "response.completed" else "length",
                            int(usage["input_tokens"]), int((usage.get("input_tokens_details") or {}).get(
                                "cached_tokens", 0)), int(usage["output_tokens"]), first, str(final["id"]),
                            str(kvres.get("session_id")))
            if kvres.get("session_length") != answer.length:
                raise TurnFailed(f"session_length {kvres.get('session_length')} is not input + output tokens "
                                 f"{answer.length}")
            return answer
    raise TurnFailed("the stream ended without response.completed")
