"""A stream read in chunks (``TokenStream.next_chunk``, what the Ray shell sends as one object when
asked with ``chunks``): each chunk holds every token out when it is taken, the job still runs at
most ``STREAM_AHEAD`` tokens past what was read, and a stream left keeps what it handed out. On the
real llama.cpp engine and the shared model, without Ray."""

from __future__ import annotations

import threading
from pathlib import Path

from kvres.actors.config import BackendConfig
from kvres.actors.generation import GenerationRequest
from kvres.actors.host.backend import BackendHost
from kvres.actors.host.scheduler import CHUNK_TOKENS, STREAM_AHEAD
from tests.conftest import local_host, shared_model_path

PROMPT = [3 + (7 * i) % 200 for i in range(30)]


def _host(tmp_path: Path) -> BackendHost:
    config = BackendConfig(name="chunks", model_path=shared_model_path(), n_ctx=1024, n_seq_max=2,
                           kv_budget_tokens=1000, n_threads=1)
    host: BackendHost = local_host(config, tmp_path)
    return host


def _greedy_reply(host: BackendHost, count: int) -> list[int]:
    """The ``count`` tokens a session given ``PROMPT`` generates (a twin of the one under test)."""
    host.open_session("twin")
    host.append("twin", PROMPT)
    return list(host.generate("twin", count))


def _steps(host: BackendHost, count: int = 16) -> None:
    """``count`` steps of the backend's loop, a stream's job among them (another session's generate)."""
    host.generate("other", count)


def test_a_chunk_holds_every_token_out_and_the_job_stays_within_stream_ahead(tmp_path: Path) -> None:
    host = _host(tmp_path)
    want = _greedy_reply(host, 40)
    host.open_session("other")
    host.append("other", PROMPT)
    host.open_session("s")
    host.append("s", PROMPT)
    stream = host.stream("s", 40)
    first = stream.next_chunk()
    _steps(host)
    # nothing of the first chunk counts read until more is asked for: the job stops STREAM_AHEAD past 0
    assert len(stream.job.produced) == STREAM_AHEAD
    second = stream.next_chunk()  # counts the first read: the loop may step on before this is taken
    # every token out when it is taken: the rest of STREAM_AHEAD, or CHUNK_TOKENS where fewer were out
    # (the loop ran ahead before the first was asked for: it takes every token out too), and never
    # more than the job may produce past what was read
    assert max(STREAM_AHEAD - len(first), CHUNK_TOKENS) <= len(second) <= STREAM_AHEAD, (first, second)
    assert first + second == want[:len(first) + len(second)]
    _steps(host)
    assert len(stream.job.produced) == len(first) + STREAM_AHEAD
    got = first + second
    while True:
        try:
            got += stream.next_chunk()
        except StopIteration:
            break
    assert got == want and host.tokens("s") == PROMPT + want
    assert stream.generation is not None and stream.generation.finish_reason == "length"


def test_a_stream_read_in_chunks_and_left_keeps_what_it_handed_out(tmp_path: Path) -> None:
    host = _host(tmp_path)
    host.open_session("other")
    host.append("other", PROMPT)
    host.open_session("s")
    host.append("s", PROMPT)
    stream = host.stream("s", 40)
    got = stream.next_chunk()
    _steps(host)
    got += stream.next_chunk()
    _steps(host)
    stream.close()  # the tokens it handed out: both chunks, not those the job ran ahead
    assert host.tokens("s") == PROMPT + got
    assert stream.generation is not None and stream.generation.finish_reason == "cancelled"


def test_an_ephemeral_stream_opens_and_closes_its_session_in_the_call_and_journals_nothing(tmp_path: Path) -> None:
    """A stateless turn (``stream(..., ephemeral=True)``): the session is opened by the call, never
    written to the journal, and closed once the stream ends, read to its end or left."""
    host = _host(tmp_path)
    want = _greedy_reply(host, 12)
    journal = host._ctx.journal
    stream = host.stream("once", 12, prompt=PROMPT, ephemeral=True)
    got = stream.next_chunk()
    assert "once" in host.sessions() and journal.load("once") is None  # open, and not in the journal
    while True:
        try:
            got += stream.next_chunk()
        except StopIteration:
            break
    assert got == want and "once" not in host.sessions() and journal.load("once") is None
    assert stream.generation is not None and list(stream.generation) == want
    left = host.stream("left", 40, prompt=PROMPT, ephemeral=True)
    next(left)
    left.close()
    assert "left" not in host.sessions() and journal.load("left") is None


def test_a_stream_that_stops_short_of_a_full_chunk_ends(tmp_path: Path) -> None:
    """A stop rule ends the job between chunks: the reader waiting for ``CHUNK_TOKENS`` takes what is
    out (a reader left waiting would hold the job, which waits for it: neither would end)."""
    host = _host(tmp_path)
    want = _greedy_reply(host, 8)
    host.open_session("s")
    host.append("s", PROMPT)
    stop_at = 2  # the first chunk is the first token alone; the stop comes one token into the next
    stream = host.stream("s", GenerationRequest(max_tokens=20, stop_token_ids=(want[stop_at],)))
    chunks: list[list[int]] = []

    def read_all() -> None:
        try:
            while True:
                chunks.append(stream.next_chunk())
        except StopIteration:
            pass

    reader = threading.Thread(target=read_all, daemon=True)
    reader.start()
    reader.join(30)
    assert not reader.is_alive(), f"the stream did not end after {chunks}"
    assert [t for c in chunks for t in c] == want[:stop_at + 1]
    assert stream.generation is not None and stream.generation.finish_reason == "stop"
    host.shutdown()
