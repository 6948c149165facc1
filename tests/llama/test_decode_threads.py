"""One thread per process decodes with its context's ``n_threads`` (``decode_threads.claim_decode_threads``):
a decode from any other live thread runs on one thread, so libgomp starts no second team of
worker threads (two teams on few cores slow every decode 2-3x, docs/notes.md), and gives the same
logits.

A thread's workers are counted by name, not by the process's thread count (which any library may
change at any moment): each decoding thread here gets a name of its own, and Linux gives a new
thread the name of the thread that starts it, so the threads that carry that name are the decoding
thread and the OpenMP team it started (libgomp keeps it as long as that thread lives)."""

from __future__ import annotations

import contextlib
import itertools
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

from kvres.actors.engines.llama import decode_threads
from kvres.actors.engines.llama.engine import LlamaContext, LlamaModel

PASSKEY = Path(__file__).resolve().parents[2] / "models" / "passkey.gguf"
TOKENS = [int(t) for t in np.random.default_rng(0).integers(3, 120, 64)]
N_THREADS = 2
_names = (f"kvres-dec{os.getpid() % 1000}-{i}" for i in itertools.count())  # at most 15 bytes


def _named(name: str) -> int:
    """How many threads of this process are called ``name``."""
    count = 0
    for tid in os.listdir("/proc/self/task"):
        with contextlib.suppress(FileNotFoundError):  # a thread that ended meanwhile
            count += Path(f"/proc/self/task/{tid}/comm").read_text().rstrip("\n") == name
    return count


def _decode_in_a_named_thread(
    ctx: LlamaContext, seq: int, claim: bool = False
) -> tuple[np.ndarray, int, Callable[[], None]]:
    """Decodes ``TOKENS`` into ``seq`` from position 0 in a new thread (which first claims the
    decode threads, if ``claim``) that stays alive afterwards: the logits, how many threads that
    thread started (its OpenMP workers) and what ends it (and waits for its end)."""
    out: dict[str, object] = {}
    done, release = threading.Event(), threading.Event()
    name = next(_names)

    def run() -> None:
        try:
            Path(f"/proc/self/task/{threading.get_native_id()}/comm").write_text(name)
            if claim:
                decode_threads.claim_decode_threads()
            ctx.seq_rm(seq, -1, -1)
            out["logits"] = ctx.decode(TOKENS, 0, seq)
            out["started"] = _named(name) - 1
        finally:
            done.set()
        release.wait()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    done.wait()

    def end() -> None:
        release.set()
        thread.join()

    assert "started" in out, "the decoding thread failed"
    return out["logits"], out["started"], end  # type: ignore[return-value]


@pytest.fixture
def ctx() -> Iterator[LlamaContext]:
    model = LlamaModel(PASSKEY)
    context = LlamaContext(model, n_ctx=512, n_seq_max=3, n_threads=N_THREADS)
    try:
        yield context
    finally:
        decode_threads.claim_decode_threads()  # the test thread decodes with n_threads again, as before
        context.close()
        model.close()


def test_another_live_thread_decodes_on_one_thread_and_starts_no_workers(ctx: LlamaContext) -> None:
    mine, team, end_mine = _decode_in_a_named_thread(ctx, 0, claim=True)
    try:
        # the claiming thread decodes with n_threads: its OpenMP team (the count sees workers)
        assert team == N_THREADS - 1
        theirs, started, end_theirs = _decode_in_a_named_thread(ctx, 1)
        end_theirs()
    finally:
        end_mine()
    assert started == 0, "a thread that did not claim started OpenMP workers"
    assert np.array_equal(mine, theirs)  # one thread or two: the same numbers


def test_a_reservation_keeps_the_first_decoding_thread_from_taking_the_team(ctx: LlamaContext) -> None:
    claimed = threading.Thread(target=decode_threads.claim_decode_threads)
    claimed.start()
    claimed.join()  # the claiming thread is gone: the team is free again
    decode_threads.reserve_decode_threads()
    _, started, end = _decode_in_a_named_thread(ctx, 0)
    taken = decode_threads._team is not None and decode_threads._team.is_alive()
    end()
    assert started == 0, "the first decoding thread started OpenMP workers"
    assert not taken  # reserved: nobody took the team by decoding first
    _, team, end = _decode_in_a_named_thread(ctx, 0, claim=True)
    end()
    assert team == N_THREADS - 1  # the claim ends the reservation
