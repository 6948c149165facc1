"""A session whose policy keeps every token resident can hold at most the backend's KV budget (a
split layout's stream where smaller): a prompt past it is refused with ``ContextLengthError``
naming the numbers, and nothing of it is appended; a generation stops there with finish_reason
"length", as at max_tokens. Through kvres.cluster sessions on a local Ray cluster, on llama.cpp
and OpenVINO (budget 2000 tokens, tests/chat/conftest.py)."""

from __future__ import annotations

import pytest

from kvres.cluster import SessionPolicy
from tests.context_limit_checks import check_the_limit

BUDGET = 2000


def _tokens(n: int, start: int = 0) -> list[int]:
    return [3 + (start + i) % 400 for i in range(n)]


@pytest.mark.parametrize("backend", ["b0", "ov"])
def test_a_prompt_past_the_limit_is_refused_and_a_reply_stops_at_it(manager, backend) -> None:
    with manager.open_session(backend=backend) as s:
        check_the_limit(s, backend, BUDGET)


def test_a_session_that_evicts_goes_on_past_it(manager) -> None:
    policy = SessionPolicy(kind="streaming", budget_tokens=512, sink_tokens=4, recent_tokens=64)
    with manager.open_session(backend="b0", policy=policy) as s:
        s.append(_tokens(1900))
        s.append(_tokens(300, 1900))
        reply = s.generate(50, ignore_eos=True)
        assert len(reply) == 50 and len(s.tokens()) == 2250
