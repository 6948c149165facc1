"""The fleet workload on OpenVINO without kvres: what one infer request of the same IR does with the same turns.

Primitives:
- ``OVRequest(model, threads)``: one infer request of the stateful IR kvres's OpenVINO backend
  compiles from the GGUF (the same converter, plugin properties and threads; f32 inference and KV),
  its KV in the request's variable states: ``feed(tokens) -> logits`` (the next-token logits of the
  last), ``save() -> KVArrays`` (a copy of the states in host RAM), ``load(kv)`` (the states set
  to a copy), ``reset()``, ``n_vocab``.
- ``ov_slot_baseline(model, w, threads)``: turns one at a time on one request, every session's
  KV states kept in host RAM between its turns (``load`` before a turn, ``save`` after it: what
  ``save_state`` / ``load_state`` are to llama-cpp-python).
- ``ov_reprefill_baseline(model, w, threads, sessions)``: no session state: every turn re-prefills
  the session's whole log (the first ``sessions`` sessions, every turn of each).
Each returns ``(timings, wall_s, extra)`` as ``benchmarks.fleet.baselines`` does; histories are
prefilled before the clock starts. There is no batching baseline: the stateful IR takes one
sequence per request. Greedy decoding; a turn's reply tokens are all fed (the last one's logits
start the next turn), as kvres does.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from .workload import TurnTiming, Workload

if TYPE_CHECKING:  # the package imports openvino: only where the OpenVINO engine runs
    from kvres.actors.engines.openvino.states import KVArrays


class OVRequest:
    def __init__(self, model: str, threads: int) -> None:
        from kvres.actors.engines.openvino import CompiledModelCache

        # a cache of its own: the compiled model goes when this request does
        self._loaded, compiled = CompiledModelCache(max_entries=1).get(Path(model), "CPU", "f32", threads)
        self._request = compiled.create_infer_request()
        self._n = 0  # entries the states hold

    @property
    def n_vocab(self) -> int:
        return int(self._loaded.vocab_size)

    def feed(self, tokens: list[int]) -> npt.NDArray[np.float32]:
        n = len(tokens)
        out = self._request.infer({
            "input_ids": np.asarray([tokens], dtype=np.int64),
            "attention_mask": np.ones((1, self._n + n), dtype=np.int64),
            "position_ids": np.arange(self._n, self._n + n, dtype=np.int64)[None],
            "beam_idx": np.zeros(1, dtype=np.int32),
        })
        self._n += n
        return np.array(out["logits"][0, -1], dtype=np.float32, copy=True)

    def save(self) -> KVArrays:
        from kvres.actors.engines.openvino.states import read_kv

        return read_kv(self._request, self._loaded.state_names, self._loaded.geometry)

    def load(self, kv: KVArrays) -> None:
        from kvres.actors.engines.openvino.states import kv_len, write_kv

        write_kv(self._request, self._loaded.state_names, kv)
        self._n = kv_len(kv)

    def reset(self) -> None:
        self._request.reset_state()
        self._n = 0


def _reply(req: OVRequest, logits: npt.NDArray[np.float32], w: Workload, t0: float) -> tuple[float, list[int]]:
    """Greedy reply from the user message's logits; (first token time, reply tokens)."""
    out: list[int] = []
    first = 0.0
    for _ in range(w.reply_tokens):
        token = int(np.argmax(logits))
        if not out:
            first = time.perf_counter() - t0
        out.append(token)
        logits = req.feed([token])
    return first, out


def ov_slot_baseline(model: str, w: Workload, threads: int) -> tuple[list[TurnTiming], float, dict[str, Any]]:
    req = OVRequest(model, threads)
    vocab = req.n_vocab
    states: dict[int, KVArrays] = {}
    for i in range(w.sessions):
        req.reset()
        req.feed(w.history_of(i, vocab))
        states[i] = req.save()
    timings = []
    t0 = time.perf_counter()
    for i, k in w.schedule():
        start = time.perf_counter() - t0
        req.load(states[i])
        first, _ = _reply(req, req.feed(w.user_turn(i, k, vocab)), w, t0)
        states[i] = req.save()
        timings.append(TurnTiming(i, k, start, first, time.perf_counter() - t0))
    wall = time.perf_counter() - t0
    held = sum(k.nbytes + v.nbytes for kv in states.values() for k, v in kv)
    return timings, wall, {"host_ram_state_bytes": held}


def ov_reprefill_baseline(model: str, w: Workload, threads: int,
                          sessions: int) -> tuple[list[TurnTiming], float, dict[str, Any]]:
    req = OVRequest(model, threads)
    vocab = req.n_vocab
    logs = {i: w.history_of(i, vocab) for i in range(sessions)}
    timings = []
    recomputed = 0
    t0 = time.perf_counter()
    for i, k in [(i, k) for i, k in w.schedule() if i < sessions]:
        start = time.perf_counter() - t0
        req.reset()
        prompt = logs[i] + w.user_turn(i, k, vocab)
        recomputed += len(logs[i])
        first, reply = _reply(req, req.feed(prompt), w, t0)
        logs[i] = prompt + reply
        timings.append(TurnTiming(i, k, start, first, time.perf_counter() - t0))
    wall = time.perf_counter() - t0
    return timings, wall, {"sessions": sessions, "recomputed_tokens_per_turn": recomputed / max(1, len(timings))}
