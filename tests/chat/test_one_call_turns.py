"""A turn in one call: ``generate`` / ``stream`` given their ``prompt``, and ``chat_stream``, through
``kvres.cluster`` sessions on llama.cpp and OpenVINO, each the same as the two calls it replaces."""

from __future__ import annotations

import pytest

PROMPT = list(range(3, 203))
TURN = list(range(40, 90))


@pytest.mark.parametrize("backend", ["b0", "ov"])
@pytest.mark.parametrize("streaming_policy", [False, True])
def test_a_prompt_given_to_generate_equals_append_then_generate(manager, backend: str, streaming_policy: bool) -> None:
    from kvres.cluster import SessionPolicy

    policy = SessionPolicy.streaming(160, recent_tokens=32) if streaming_policy else None
    with manager.open_session(policy=policy, backend=backend) as two, \
            manager.open_session(policy=policy, backend=backend) as one:
        two.append(PROMPT)
        two.append(TURN)
        expected = two.generate(20, ignore_eos=True)
        got = one.generate(20, ignore_eos=True, prompt=PROMPT + TURN)
        assert list(got) == list(expected)
        assert got.prompt_tokens == len(PROMPT) + len(TURN) and expected.prompt_tokens is None
        assert one.tokens() == two.tokens()
        # the next turn, streamed, with its prompt in the same call
        two.append(TURN)
        expected = two.generate(12, ignore_eos=True)
        stream = one.stream(12, ignore_eos=True, prompt=TURN)
        assert list(stream) == list(expected)
        assert stream.generation is not None and stream.generation.prompt_tokens == len(TURN)
        assert one.tokens() == two.tokens()
        assert got.length == len(PROMPT + TURN) + 20  # the log's length as the call committed it
        assert stream.generation.length == len(one.tokens())


@pytest.mark.parametrize("taken", [1, 3])
def test_a_stream_left_after_its_first_tokens_keeps_its_prompt_and_them(manager, taken: int) -> None:
    """(Left after one: the first token is handed out before the session's next step puts it in
    the log; leaving then keeps it all the same.)"""
    with manager.open_session(backend="b0") as s:
        s.append(PROMPT)
        stream = s.stream(200, ignore_eos=True, prompt=TURN)
        first = [next(stream) for _ in range(taken)]
        stream.close()
        assert s.tokens() == PROMPT + TURN + first
        assert stream.generation is not None and list(stream.generation) == first


def test_chat_stream_equals_chat(manager) -> None:
    messages = [{"role": "user", "content": "Tell me about the cat."}]
    with manager.open_session(backend="chat") as by_chat, manager.open_session(backend="chat") as by_stream:
        reply = by_chat.chat(messages, max_tokens=24)
        stream = by_stream.chat_stream(messages, max_tokens=24)
        tokens = list(stream)
        assert tokens == list(reply)
        assert stream.generation is not None and stream.generation.prompt_tokens == reply.prompt_tokens > 0
        assert stream.generation.text == reply.text


def test_a_reply_text_keeps_its_first_tokens_leading_space(manager) -> None:
    """llama.cpp drops the leading space of the first token it decodes; a reply is decoded after
    the log's token before it, so the log reads as the prompt's text plus the reply's."""
    with manager.open_session(backend="b0") as s:
        for _ in range(3):
            reply = s.generate(8, ignore_eos=True, prompt=PROMPT[:7])
            log = s.tokens()
            before = s.detokenize(log[: len(log) - len(reply)])
            assert s.detokenize(log) == before + reply.text


@pytest.mark.parametrize("backend", ["b0", "ov"])
def test_max_tokens_zero_answers_no_tokens_and_appends_only_the_prompt(manager, backend: str) -> None:
    with manager.open_session(backend=backend) as s:
        s.append(PROMPT)
        reply = s.generate(0)
        assert list(reply) == [] and reply.finish_reason == "length" and s.tokens() == PROMPT
        reply = s.generate(0, prompt=TURN)
        assert list(reply) == [] and reply.prompt_tokens == len(TURN) and s.tokens() == PROMPT + TURN
        assert list(s.stream(0)) == [] and s.tokens() == PROMPT + TURN
        assert len(s.generate(3, ignore_eos=True)) == 3  # and the session goes on
