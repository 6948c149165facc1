"""Streams end where the caller leaves them (issue #49): a stream runs at most ``STREAM_AHEAD``
tokens ahead of what its reader took, and however it is left (``break`` with the stream still held,
``del``, ``close()``, a ``with`` block, garbage collection) its session keeps exactly the tokens it
handed out; the handle's next call (or a call that changes the session from another handle of the
same driver) ends it instead of being refused with ``SessionBusyError``. Through ``kvres.cluster``
sessions on a local Ray cluster, on llama.cpp ("b0") and OpenVINO ("ov"). A driver killed
mid-stream is tests/faults/test_driver_death.py, an HTTP client that leaves
tests/serve/test_leaving_streams_http.py."""

from __future__ import annotations

import gc

import pytest

from kvres.actors.host.scheduler import STREAM_AHEAD

PROMPT = list(range(3, 23))
ENGINES = ["b0", "ov"]


def _take(stream, count: int) -> list[int]:
    got: list[int] = []
    for token in stream:
        got.append(token)
        if len(got) == count:
            break
    return got


def _twin_agrees(manager, backend: str, s, log: list[int]) -> None:
    """The session's log and KV are those of a twin given the same tokens: it goes on identically."""
    with manager.open_session(backend=backend) as twin:
        twin.append(log)
        assert s.generate(8, ignore_eos=True) == twin.generate(8, ignore_eos=True)


@pytest.mark.parametrize("backend", ENGINES)
def test_break_with_the_stream_held_then_the_next_call_commits_what_it_handed_out(manager, backend) -> None:
    with manager.open_session(backend=backend) as s:
        s.append(PROMPT)
        stream = s.stream(200, ignore_eos=True)
        got = _take(stream, 3)  # the loop is left; `stream` still holds the stream
        s.append([5])  # not SessionBusyError: the handle ends its stream first
        assert stream.finish_reason == "cancelled" and list(stream.generation or []) == got
        assert s.tokens() == PROMPT + got + [5]
        _twin_agrees(manager, backend, s, PROMPT + got + [5])
        assert list(stream) == []  # it ended


@pytest.mark.parametrize("backend", ENGINES)
def test_a_held_stream_runs_at_most_stream_ahead_tokens_past_its_reader(manager, backend) -> None:
    with manager.open_session(backend=backend) as s, manager.open_session(backend=backend) as other, \
            manager.open_session(backend=backend) as twin:
        for session in (s, other, twin):
            session.append(PROMPT)
        stream = s.stream(60, ignore_eos=True)
        got = [next(stream) for _ in range(3)]
        other.generate(32, ignore_eos=True)  # 32 steps of the backend, the held stream's job among them
        watcher = manager.session(s.session_id)  # another handle's read leaves the stream running
        assert len(PROMPT) + 3 < len(watcher.tokens()) <= len(PROMPT) + 3 + STREAM_AHEAD
        got += list(stream)  # read on, the stream goes on where it stood
        assert got == twin.generate(60, ignore_eos=True)
        assert stream.finish_reason == "length" and s.tokens() == PROMPT + got


@pytest.mark.parametrize("backend", ENGINES)
def test_a_stream_whose_tokens_are_all_out_commits_only_what_its_reader_took(manager, backend) -> None:
    with manager.open_session(backend=backend) as s, manager.open_session(backend=backend) as other:
        s.append(PROMPT)
        other.append(PROMPT)
        stream = s.stream(4, ignore_eos=True)  # all 4 within STREAM_AHEAD: the backend produces them all
        got = [next(stream) for _ in range(2)]
        other.generate(16, ignore_eos=True)  # steps enough to end the call, were it not waiting for its reader
        s.append([5])
        assert s.tokens() == PROMPT + got + [5]
        assert stream.finish_reason == "cancelled" and list(stream.generation or []) == got


@pytest.mark.parametrize("backend", ENGINES)
def test_reading_the_log_through_the_handle_ends_its_stream(manager, backend) -> None:
    with manager.open_session(backend=backend) as s:
        s.append(PROMPT)
        stream = s.stream(200, ignore_eos=True)
        got = _take(stream, 3)
        assert s.tokens() == PROMPT + got
        assert s.stats()["token_count"] == len(PROMPT) + 3


@pytest.mark.parametrize("backend", ENGINES)
def test_another_handle_of_the_driver_that_changes_the_session_ends_its_stream(manager, backend) -> None:
    with manager.open_session(backend=backend) as s:
        s.append(PROMPT)
        stream = s.stream(200, ignore_eos=True)
        got = [next(stream) for _ in range(3)]
        again = manager.session(s.session_id)
        again.append([5])
        assert stream.finish_reason == "cancelled"
        assert again.tokens() == PROMPT + got + [5]


@pytest.mark.parametrize("backend", ENGINES)
@pytest.mark.parametrize("leave", ["del", "close", "with"])
def test_a_stream_left_by_del_close_or_with_commits_what_it_handed_out(manager, backend, leave) -> None:
    with manager.open_session(backend=backend) as s:
        s.append(PROMPT)
        stream = s.stream(200, ignore_eos=True)
        if leave == "with":
            with stream:
                got = _take(stream, 3)
        else:
            got = _take(stream, 3)
            if leave == "del":
                del stream
            else:
                stream.close()
        assert manager.session(s.session_id).tokens() == PROMPT + got  # ended: another handle reads it
        s.append([5])
        assert s.tokens() == PROMPT + got + [5]


@pytest.mark.parametrize("backend", ENGINES)
def test_a_stream_collected_by_the_garbage_collector_commits_what_it_handed_out(manager, backend) -> None:
    with manager.open_session(backend=backend) as s:
        s.append(PROMPT)
        gc.disable()  # collected when this test says, not before
        try:
            stream = s.stream(200, ignore_eos=True)
            stream.cycle = stream  # type: ignore[attr-defined]  # only the cycle collector frees it
            got = _take(stream, 3)
            del stream
            gc.collect()
        finally:
            gc.enable()
        assert manager.session(s.session_id).tokens() == PROMPT + got
        s.append([5])
        assert s.tokens() == PROMPT + got + [5]


def test_a_chat_stream_left_with_break_keeps_what_it_handed_out_for_the_next_turn(manager) -> None:
    messages = [{"role": "user", "content": "Tell me a story."}]
    with manager.open_session(backend="chat") as s:
        stream = s.chat_stream(messages, max_tokens=200, ignore_eos=True)
        got = _take(stream, 3)
        held = len(s.tokens())  # the turn's prompt and the 3 tokens handed out
        assert stream.finish_reason == "cancelled" and list(stream.generation or []) == got
        assert s.tokens()[held - 3:] == got
        reply = s.chat(messages + [{"role": "assistant", "content": s.detokenize(got)},
                                   {"role": "user", "content": "And then?"}], max_tokens=4)
        assert len(reply) <= 4


@pytest.mark.parametrize("backend", ENGINES)
def test_a_stream_read_in_chunks_carries_every_token_out_in_one_object_and_keeps_the_rule(manager, backend) -> None:
    """``TokenStream.chunks()``: one Ray object per chunk, each every token the backend had out when
    the last was taken; the backend still runs at most ``STREAM_AHEAD`` past what the driver took,
    and a stream left keeps the chunks it handed out."""
    with manager.open_session(backend=backend) as s, manager.open_session(backend=backend) as other, \
            manager.open_session(backend=backend) as twin:
        for session in (s, other, twin):
            session.append(PROMPT)
        want = list(twin.generate(60, ignore_eos=True))
        stream = s.stream(60, ignore_eos=True)
        chunks = stream.chunks()
        got = next(chunks) + next(chunks)
        other.generate(32, ignore_eos=True)  # the driver holds back: the backend runs ahead, then waits
        watcher = manager.session(s.session_id)  # another handle's read leaves the stream running
        held = len(watcher.tokens()) - len(PROMPT)
        assert len(got) < held <= len(got) + STREAM_AHEAD
        third, fourth = next(chunks), next(chunks)  # what the backend ran ahead comes in few objects
        assert len(third) + len(fourth) >= STREAM_AHEAD and max(len(third), len(fourth)) > 1
        got += third + fourth
        stream.close()
        assert got == want[:len(got)] and stream.finish_reason == "cancelled"
        assert s.tokens() == PROMPT + got
        again = s.stream(60 - len(got), ignore_eos=True)
        assert got + [t for chunk in again.chunks() for t in chunk] == want
        with pytest.raises(Exception, match="chunks"):
            next(again)  # read one way only
