"""Where a session's log ends in a conversation's rendering is found near the log's own length: a
chat turn whose log reads back in other tokens than the rendering's (every turn on a SentencePiece
model: its log reads a space after a control token that the rendering lacks) detokenizes the
conversation a few times, not ~log2 of its length. ``first_true`` against a linear scan (fixed
seeds), and the plan of such a turn on the real engine (stories260K with a chat template), counted."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from benchmarks.chat_fleet.sides import ChatModel
from benchmarks.chat_fleet.workload import ChatWorkload, build_conversations
from kvres.actors.generation import GenerationRequest
from kvres.actors.host.backend import BackendHost
from kvres.actors.host.chat import first_true
from kvres.actors.sampling import SamplingParams
from tests.hypothesis_profiles import examples

from .conftest import stories_chat_host

TEXT_ONLY = GenerationRequest(max_tokens=16, sampling=SamplingParams(temperature=0.0, grammar="root ::= [a-z ]+"),
                              ignore_eos=True)


@settings(max_examples=examples(400), deadline=None)
@given(st.integers(0, 50), st.integers(0, 3000), st.integers(0, 3000), st.integers(-100, 3100))
def test_first_true_is_the_least_point_and_asks_little_near_the_guess(lo: int, span: int, at: int,
                                                                       guess: int) -> None:
    hi = lo + span
    answer = lo + min(at, span)  # false below it, true from it on (and at hi)
    asked: list[int] = []

    def holds(m: int) -> bool:
        assert lo <= m <= hi, (m, lo, hi)  # never asked outside the range
        asked.append(m)
        return m >= answer

    assert first_true(lo, hi, guess, holds) == answer
    distance = abs(answer - min(max(guess, lo), hi))
    assert len(asked) <= 2 * math.log2(distance + 1) + 3, (distance, asked)


@pytest.fixture()
def host(tmp_path) -> Iterator[BackendHost]:  # type: ignore[no-untyped-def]
    yield from stories_chat_host(tmp_path, "plan-search", 4096, 1)


def test_a_conversation_read_back_in_other_tokens_is_planned_with_a_few_detokenizations(host: BackendHost) -> None:
    """The chat fleet's conversations (seeded words, each reply sent back as its text): from the
    third turn on, the log reads back as the rendering only in other tokens than the rendering's."""
    model = host._ctx.executor.model_path
    chat = ChatModel(Path(model))
    w = ChatWorkload(conversations=1, slots=1, clients=1, turns=6, history_tokens=256, user_tokens=32, reply_tokens=16)
    conversation = build_conversations(w, chat.count, chat.render)[0]
    executor = host._ctx.executor
    calls: list[int] = []
    detokenize = executor.detokenize

    def counted(tokens: Any, special: bool = False) -> str:
        calls.append(len(tokens))
        return detokenize(tokens, special)

    executor.detokenize = counted  # type: ignore[method-assign]
    host.open_session("s")
    messages: list[dict[str, Any]] = list(conversation.history)
    read_back = 0
    for k in range(-1, w.turns):
        if k >= 0:
            messages.append({"role": "user", "content": conversation.user_turns[k]})
        log = host.tokens("s")
        calls.clear()
        reply = host.chat("s", messages, TEXT_ONLY)
        assert reply.prefix_break is None, reply.prefix_break  # the whole log kept, every turn
        whole = [n for n in calls if n > len(log)]  # the rendering read back: the slow path
        read_back += bool(whole) and len(log) > 0
        passes = [n for n in calls if n >= len(log) // 2 > 0]  # each a pass over the whole conversation
        assert len(passes) <= 6, (k, len(log), calls)  # halving [0, len(whole)] would take ~log2 of it more
        messages.append({"role": "assistant", "content": reply.text})
    assert read_back >= 2  # the turns above took the read-back path
