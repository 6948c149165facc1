"""Budgets hold on openvino-genai as on the other engines, through kvres.cluster sessions on a local
Ray cluster (backend "genai": kv_budget_tokens=2000, tests/cluster/conftest.py): a prompt past a
session's context limit is refused with ``ContextLengthError`` (what ``kvres serve`` answers as
HTTP 400 ``context_length_exceeded``) and nothing of it is appended; a generation stops there with
finish_reason "length". A session the engine evicts in is bounded by the engine's KV pool, which
each request fills with its whole log."""

from __future__ import annotations

import pytest

from kvres.cluster import SessionPolicy
from kvres.cluster.serve.http_errors import api_error
from kvres.policy import ContextLengthError
from tests.context_limit_checks import check_the_limit

BUDGET = 2000
POOL = 8192  # the genai backend's KV pool: 256 blocks of 32 cells


def _tokens(n: int, start: int = 0) -> list[int]:
    return [3 + (start + i) % 400 for i in range(n)]


def test_a_prompt_past_the_budget_is_refused_and_a_reply_stops_at_it(manager) -> None:
    with manager.open_session(backend="genai") as s:
        answer = api_error(check_the_limit(s, "genai", BUDGET))
        assert (answer.status, answer.code) == (400, "context_length_exceeded")


def test_a_session_the_engine_evicts_in_goes_past_the_budget_up_to_the_pool(manager) -> None:
    with manager.open_session(backend="genai", policy=SessionPolicy.engine_evicts(96, recent_tokens=32)) as s:
        s.append(_tokens(1900))
        s.append(_tokens(6100, 1900))
        with pytest.raises(ContextLengthError, match=rf"8300 is past the {POOL} tokens one session can hold on backend "
                                                     rf"'genai' \(the openvino-genai KV pool of {POOL} cells"):
            s.append(_tokens(300, 8000))
        assert s.tokens() == _tokens(8000)
