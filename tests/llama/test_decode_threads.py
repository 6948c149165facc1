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

from kvres.actors.engines.llama import engine
from kvres.actors.engines.llama.engine import LlamaContext, LlamaModel

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


def _fewest_new_threads(ctx: LlamaContext, seq: int, tries: int = 3) -> tuple[np.ndarray, int]:
    """The logits of a decode in a new live thread, and the fewest threads that appeared with it
    over ``tries`` such threads. OpenMP workers would come with every one of them (each thread
    that runs a parallel decode gets its own team); a thread some other library starts at the
    same moment comes once."""
    fewest, logits = 1 << 30, None
    for _ in range(tries):
        ctx.seq_rm(seq, -1, -1)  # each try decodes the same tokens from position 0
        before = _threads()
        got, during, end = _decode_in_a_live_thread(ctx, seq)
        end()
        logits = got if logits is None else logits
        fewest = min(fewest, during - before)
        if fewest == 1:
            break
    assert logits is not None
    return logits, fewest


def test_another_live_thread_decodes_on_one_thread_and_starts_no_workers() -> None:
    model = LlamaModel(PASSKEY)
    ctx = LlamaContext(model, n_ctx=512, n_seq_max=3, n_threads=2)
    try:
        engine.claim_decode_threads()
        mine = ctx.decode(TOKENS, 0, 0)  # the claiming thread: two threads (its team starts here)
        theirs, new = _fewest_new_threads(ctx, 1)
        assert new == 1, "only the decoding thread itself is new: no OpenMP workers for it"
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
        _, new = _fewest_new_threads(ctx, 0)
        assert new == 1, "the first decoding thread started OpenMP workers"
        ctx.seq_rm(0, -1, -1)
        _, _, end = _decode_in_a_live_thread(ctx, 0)
        taken = engine._team is not None and engine._team.is_alive()
        end()
        assert not taken  # reserved: nobody took the team by decoding first
    finally:
        engine.claim_decode_threads()
        ctx.close()
        model.close()
