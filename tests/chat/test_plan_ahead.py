"""A chat turn is planned (the conversation rendered, tokenized, compared with the session's log)
without the host's lock, so the step loop decodes the other sessions meanwhile; the plan is used
only where the session's log is still the one it was made on. On the real engine, without Ray (the
backend host), with the shared stories260K and a chat template."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from kvres.actors.generation import GenerationRequest
from kvres.actors.host.backend import BackendHost
from kvres.actors.sampling import SamplingParams

from .conftest import stories_chat_host

TEXT_ONLY = GenerationRequest(max_tokens=16, sampling=SamplingParams(temperature=0.0, grammar="root ::= [a-z ]+"),
                              ignore_eos=True)


@pytest.fixture()
def host(tmp_path) -> Iterator[BackendHost]:  # type: ignore[no-untyped-def]
    yield from stories_chat_host(tmp_path, "plan-ahead", 2048, 2)


def test_a_turn_is_planned_while_the_other_sessions_decode(host: BackendHost) -> None:
    host.open_session("long")
    host.append("long", host.tokenize("once upon a time", add_bos=True))
    host.open_session("chat")
    messages: list[dict[str, Any]] = [{"role": "user", "content": "the cat sat on the mat"}]
    first = host.chat("chat", messages, TEXT_ONLY)
    messages += [{"role": "assistant", "content": first.text}, {"role": "user", "content": "and then"}]

    read = [0]
    stream = host.stream("long", GenerationRequest(max_tokens=400, ignore_eos=True))
    reader = threading.Thread(target=lambda: [read.__setitem__(0, read[0] + 1) for _ in stream], daemon=True)
    reader.start()
    while read[0] < 8:  # the long generation is under way
        time.sleep(0.001)

    decoded_while_planning: list[int] = []
    plan_on = host._chat.plan_on

    def watched(log: list[int], *args: Any, **kwargs: Any) -> Any:
        before, deadline = read[0], time.monotonic() + 10.0
        while read[0] < before + 4 and time.monotonic() < deadline and reader.is_alive():
            time.sleep(0.001)  # a plan under the host's lock would see no token of the other session
        decoded_while_planning.append(read[0] - before)
        return plan_on(log, *args, **kwargs)

    host._chat.plan_on = watched  # type: ignore[method-assign]
    reply = host.chat("chat", messages, TEXT_ONLY)
    reader.join(timeout=60)
    assert decoded_while_planning and decoded_while_planning[0] >= 4, decoded_while_planning
    assert len(decoded_while_planning) == 1  # made once, ahead, and used: the log did not change
    assert reply.prefix_break is None and len(reply) == 16


def test_a_plan_made_on_a_log_that_changed_since_is_made_again(host: BackendHost) -> None:
    host.open_session("s")
    messages: list[dict[str, Any]] = [{"role": "user", "content": "the cat sat on the mat"}]
    first = host.chat("s", messages, TEXT_ONLY)
    messages += [{"role": "assistant", "content": first.text}, {"role": "user", "content": "and then"}]
    ahead = host._chat.plan_ahead("s", messages)
    assert ahead is not None and ahead.log == host.tokens("s")

    host.append("s", host.tokenize(" more", add_bos=False))  # the log moves on after the plan was made
    now = host.tokens("s")
    keep, tokens, held = host._chat.plan_checked("s", messages, ahead)
    fresh = host._chat.plan_on(now, messages)
    assert held == len(now) and (keep, tokens) == (fresh.keep, fresh.tokens)
    assert len(ahead.log) <= keep < held  # the tokens appended since are cut (the plan ahead saw none)
