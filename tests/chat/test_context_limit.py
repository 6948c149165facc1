"""A session whose policy keeps every token resident can hold at most the backend's KV budget (a
split layout's stream where smaller): a prompt past it is refused with ``ContextLengthError``
naming the numbers, and nothing of it is appended; a generation stops there with finish_reason
"length", as at max_tokens. Through kvres.cluster sessions on a local Ray cluster, on llama.cpp
and OpenVINO (budget 2000 tokens, tests/chat/conftest.py)."""

from __future__ import annotations

import pytest

from kvres.cluster import SessionPolicy
from kvres.policy import ContextLengthError

BUDGET = 2000


def _tokens(n: int, start: int = 0) -> list[int]:
    return [3 + (start + i) % 400 for i in range(n)]


@pytest.mark.parametrize("backend", ["b0", "ov"])
def test_a_prompt_past_the_limit_is_refused_and_a_reply_stops_at_it(manager, backend) -> None:
    with manager.open_session(backend=backend) as s:
        s.append(_tokens(1900))
        with pytest.raises(ContextLengthError, match=r"holds 1900 tokens and the call brings 150 more: 2050 is past "
                                                     rf"the {BUDGET} tokens one session can hold on backend '{backend}' "
                                                     rf"\(kv_budget_tokens={BUDGET}\)"):
            s.append(_tokens(150, 1900))
        with pytest.raises(ContextLengthError, match="2050 is past"):  # a prompt given with the generate
            s.generate(5, prompt=_tokens(150, 1900))
        assert s.tokens() == _tokens(1900)  # nothing of either was appended
        reply = s.generate(300, ignore_eos=True)
        assert reply.finish_reason == "length" and len(reply) == BUDGET - 1900
        assert s.tokens() == _tokens(1900) + list(reply)
        nothing = s.generate(10, ignore_eos=True)  # full: it ends at once, as at max_tokens
        assert list(nothing) == [] and nothing.finish_reason == "length" and len(s.tokens()) == BUDGET
        s.rollback(30)
        stream = s.stream(100, ignore_eos=True)
        assert len(list(stream)) == 30 and stream.finish_reason == "length"
        assert len(s.tokens()) == BUDGET


def test_a_session_that_evicts_goes_on_past_it(manager) -> None:
    policy = SessionPolicy(kind="streaming", budget_tokens=512, sink_tokens=4, recent_tokens=64)
    with manager.open_session(backend="b0", policy=policy) as s:
        s.append(_tokens(1900))
        s.append(_tokens(300, 1900))
        reply = s.generate(50, ignore_eos=True)
        assert len(reply) == 50 and len(s.tokens()) == 2250
