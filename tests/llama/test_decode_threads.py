"""One thread per process decodes with its context's ``n_threads`` (``engine.claim_decode_threads``):
a decode from any other live thread runs on one thread, so libgomp starts no second team of
worker threads (two teams on few cores slow every decode 2-3x, docs/notes.md), and gives the same
logits."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path

import numpy as np

from kvres.actors.llama import engine
from kvres.actors.llama.engine import LlamaContext, LlamaModel

PASSKEY = Path(__file__).resolve().parents[2] / "models" / "passkey.gguf"
TOKENS = [int(t) for t in np.random.default_rng(0).integers(3, 120, 64)]


def _threads() -> int:
    return len(os.listdir("/proc/self/task"))


def _decode_in_a_live_thread(ctx: LlamaContext, seq: int) -> tuple[np.ndarray, int, Callable[[], None]]:
    """Decodes in a thread that stays alive afterwards: the logits, the process's thread count
    while it lives, and what ends it (and waits for its end)."""
    out: dict[str, object] = {}
    done, release = threading.Event(), threading.Event()

    def run() -> None:
        out["logits"] = ctx.decode(TOKENS, 0, seq)
        done.set()
        release.wait()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    done.wait()

    def end() -> None:
        release.set()
        thread.join()

    return out["logits"], _threads(), end  # type: ignore[return-value]


def test_another_live_thread_decodes_on_one_thread_and_starts_no_workers() -> None:
    model = LlamaModel(PASSKEY)
    ctx = LlamaContext(model, n_ctx=512, n_seq_max=3, n_threads=2)
    try:
        engine.claim_decode_threads()
        mine = ctx.decode(TOKENS, 0, 0)  # the claiming thread: two threads (its team starts here)
        before = _threads()
        theirs, during, end = _decode_in_a_live_thread(ctx, 1)
        end()
        assert during == before + 1, "only the decoding thread itself is new: no OpenMP workers for it"
        assert np.array_equal(mine, theirs)  # one thread or two: the same numbers
    finally:
        ctx.close()
        model.close()


def test_a_reservation_keeps_the_first_decoding_thread_from_taking_the_team() -> None:
    model = LlamaModel(PASSKEY)
    ctx = LlamaContext(model, n_ctx=512, n_seq_max=3, n_threads=2)
    try:
        claimed = threading.Thread(target=engine.claim_decode_threads)
        claimed.start()
        claimed.join()  # the claiming thread is gone: the team is free again
        engine.reserve_decode_threads()
        before = _threads()
        _, during, end = _decode_in_a_live_thread(ctx, 0)
        taken = engine._team is not None and engine._team.is_alive()
        end()
        assert during == before + 1, "the first decoding thread started OpenMP workers"
        assert not taken  # reserved: nobody took the team by decoding first
    finally:
        engine.claim_decode_threads()
        ctx.close()
        model.close()
