"""The fleet workload without kvres: what llama-cpp-python and llama.cpp do with the same turns.

Primitives:
- ``slot_baseline(model, w, threads)``: one ``llama_cpp.Llama``, turns one at a time, every
  session's state kept in host RAM between its turns (``load_state`` before a turn,
  ``save_state`` after it: what llama-server's slot save / restore offers).
- ``reprefill_baseline(model, w, threads, sessions)``: a server without session state: every turn
  re-prefills the session's whole log (the first ``sessions`` sessions, every turn of each).
- ``batch_baseline(model, w, threads)``: llama.cpp batching the same turns itself: every session
  resident in one context (one sequence each), ``w.users`` users each driving its sessions one
  after another; each step is one ``llama_decode`` (``LlamaContext.decode_many``, a
  ``llama_batch``) holding the user message of every turn that starts and one token of every turn
  that decodes.
  ``batch_baseline(model, w, threads, max_active=k)``: the same with at most ``k`` turns under way at
  once (the others' users wait, first come first served): the engine's own bound for a server
  with ``k`` sequence slots, which can batch no more than ``k`` sessions' turns together, here
  with every session resident and no KV moved in or out.
Each returns ``(timings, wall_s, extra)``; histories are prefilled before the clock starts.
Greedy decoding everywhere; a turn's reply tokens are all decoded (the last one's logits start the
next turn), as kvres does.
"""

from __future__ import annotations

import ctypes
import time
from typing import Any

import numpy as np

from .workload import TurnTiming, Workload


def _argmax_last(llm: Any) -> int:
    import llama_cpp

    ptr = llama_cpp.llama_get_logits_ith(llm.ctx, -1)
    return int(np.argmax(np.ctypeslib.as_array(ctypes.cast(ptr, ctypes.POINTER(ctypes.c_float)),
                                               shape=(llm.n_vocab(),))))


def _llama(model: str, n_ctx: int, threads: int) -> Any:
    from llama_cpp import Llama

    return Llama(model_path=model, n_ctx=n_ctx, n_threads=threads, n_threads_batch=threads, n_batch=512,
                 verbose=False)


def _reply(llm: Any, w: Workload, t0: float) -> tuple[float, list[int]]:
    """Greedy reply after the user's message was evaluated; (first token time, reply tokens)."""
    out: list[int] = []
    first = 0.0
    for _ in range(w.reply_tokens):
        token = _argmax_last(llm)
        if not out:
            first = time.perf_counter() - t0
        out.append(token)
        llm.eval([token])
    return first, out


def slot_baseline(model: str, w: Workload, threads: int) -> tuple[list[TurnTiming], float, dict[str, Any]]:
    llm = _llama(model, w.tokens_per_session + 64, threads)
    try:
        vocab = llm.n_vocab()
        states = {}
        for i in range(w.sessions):
            llm.reset()
            llm.eval(w.history_of(i, vocab))
            states[i] = llm.save_state()
        timings = []
        t0 = time.perf_counter()
        for i, k in w.schedule():
            start = time.perf_counter() - t0
            llm.load_state(states[i])
            llm.eval(w.user_turn(i, k, vocab))
            first, _ = _reply(llm, w, t0)
            states[i] = llm.save_state()
            timings.append(TurnTiming(i, k, start, first, time.perf_counter() - t0))
        wall = time.perf_counter() - t0
        parked = sum(int(s.llama_state_size) for s in states.values())
        return timings, wall, {"host_ram_state_bytes": parked}
    finally:
        llm.close()


def reprefill_baseline(model: str, w: Workload, threads: int, sessions: int) -> tuple[list[TurnTiming], float, dict[str, Any]]:
    llm = _llama(model, w.tokens_per_session + 64, threads)
    try:
        vocab = llm.n_vocab()
        logs = {i: w.history_of(i, vocab) for i in range(sessions)}
        timings = []
        recomputed = 0
        t0 = time.perf_counter()
        for i, k in [(i, k) for i, k in w.schedule() if i < sessions]:
            start = time.perf_counter() - t0
            llm.reset()
            prompt = logs[i] + w.user_turn(i, k, vocab)
            recomputed += len(logs[i])
            llm.eval(prompt)
            first, reply = _reply(llm, w, t0)
            logs[i] = prompt + reply
            timings.append(TurnTiming(i, k, start, first, time.perf_counter() - t0))
        wall = time.perf_counter() - t0
        return timings, wall, {"sessions": sessions, "recomputed_tokens_per_turn": recomputed / max(1, len(timings))}
    finally:
        llm.close()


def batch_baseline(model: str, w: Workload, threads: int,
                   max_active: int | None = None) -> tuple[list[TurnTiming], float, dict[str, Any]]:
    from kvres.actors.engines.llama.engine import LlamaContext, LlamaModel

    m = LlamaModel(model)
    n_ctx = w.sessions * (w.tokens_per_session + 16)
    n_ctx += n_ctx % 2
    ctx = LlamaContext(m, n_ctx=n_ctx, n_seq_max=w.sessions, n_batch=512, n_threads=threads)
    try:
        vocab = m.n_vocab
        pos = {}
        for i in range(w.sessions):
            history = w.history_of(i, vocab)
            ctx.decode(history, 0, i, logits=False)
            pos[i] = len(history)
        queues = {u: [(i, k) for k in range(w.turns) for i in w.sessions_of(u)] for u in range(w.users)}
        limit = w.users if max_active is None else max_active
        # per user: [session, turn, start, first, tokens to decode next, reply tokens left]; a turn starts
        # when its user is ready for it (a turn waiting for room to run counts that wait)
        active: dict[int, list[Any]] = {}
        ready = dict.fromkeys(queues, 0.0)
        timings = []
        t0 = time.perf_counter()
        while queues or active:
            for u in [u for u in queues if u not in active]:  # dicts keep order: the longest idle first
                if queues[u] and len(active) >= limit:
                    break
                if queues[u]:
                    i, k = queues[u].pop(0)
                    active[u] = [i, k, ready[u], 0.0, w.user_turn(i, k, vocab), w.reply_tokens]
                else:
                    del queues[u]
            if not active:
                break
            users = list(active)
            logits = ctx.decode_many([(active[u][4], pos[active[u][0]], active[u][0]) for u in users])
            now = time.perf_counter() - t0
            for u, lg in zip(users, logits, strict=True):
                turn = active[u]
                pos[turn[0]] += len(turn[4])
                if turn[5] == 0:  # its last reply token is in: the turn is done
                    timings.append(TurnTiming(turn[0], turn[1], turn[2], turn[3], now))
                    del active[u]
                    ready[u] = now
                    if u in queues:  # to the back of the line for the next turn
                        queues[u] = queues.pop(u)
                    continue
                if turn[5] == w.reply_tokens:
                    turn[3] = now
                turn[4] = [int(np.argmax(lg))]
                turn[5] -= 1
        wall = time.perf_counter() - t0
        return timings, wall, {"n_ctx": n_ctx, "max_active": limit}
    finally:
        ctx.close()
        m.close()
