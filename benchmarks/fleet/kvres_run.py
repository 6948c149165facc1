"""The fleet workload through kvres: ``kvres.cluster`` sessions on a real local Ray cluster.

Primitives:
- ``backend_config(w, slots, model, threads, name, engine="llama", kv_layout="unified")``: one
  backend with ``slots`` sequence slots and a KV budget of ``slots`` full sessions (fewer slots
  than sessions: the rest park); ``engine="openvino"``: the OpenVINO engine in state mode on the
  same GGUF; ``kv_layout="split"`` (llama.cpp): each slot its own KV stream.
- ``wait_for_probes(manager, backend)``: waits for the backend's background recall-cost probes
  (a child process decoding on the same cores) to end.
- ``kvres_fleet(manager, w, backend, vocab, two_calls=False, high=0) -> (timings, wall_s, extra)``:
  opens the workload's sessions (the first ``high`` of them with priority 1, the rest 0) and
  appends their histories, waits for the probes (before the clock), then ``w.users`` driver threads each
  take their sessions' turns one after another: one ``stream(reply_tokens, prompt=user message)``
  call per turn (``two_calls``: ``append`` the message, then ``stream`` the reply), the first
  token's arrival is the time to first token; afterwards the sessions' counters
  (suspends, resumes, evictions, recomputed tokens) over the timed part, the backend's peak
  resident tokens, the bytes of parked KV per cold-store tier, and where the backend's step loop
  spent the wall time (``loop``: steps, ms per step in the step and in the engine's decode, tokens
  per step, the engine's and the steps' shares of the wall); the sessions are closed.
- ``first_turns(manager, w, backend, vocab, turns=4)``: on a backend that has just started (its
  recall-cost probes still running on a fresh probe cache), one session's history appended, then
  ``turns`` turns one after another: the first turn's seconds, the later ones' median, their ratio.
- ``open_cost(manager, w, backend, vocab, repeats)``: what opening a session that starts with the
  shared prefix costs (open + append of the ``shared_prefix`` tokens), beside appending the same
  number of tokens nobody shares; medians.
"""

from __future__ import annotations

import statistics
import threading
import time
from typing import Any

import numpy as np

from .workload import TurnTiming, Workload

COUNTED = ("suspends", "resumes", "evictions", "recomputed_tokens", "recalls", "spills")


def backend_config(w: Workload, slots: int, model: str, threads: int, name: str, engine: str = "llama",
                   kv_layout: str = "unified") -> Any:
    from kvres.cluster import BackendConfig

    budget = slots * (w.tokens_per_session + 64)
    budget += budget % 2
    options: dict[str, Any] = {"engine": "openvino", "openvino_mode": "state"} if engine == "openvino" \
        else {"kv_layout": kv_layout}
    return BackendConfig(name=name, model_path=model, n_ctx=budget, n_seq_max=slots, kv_budget_tokens=budget,
                         n_threads=threads, **options)


def _counters(sessions: list[Any]) -> dict[str, int]:
    total = dict.fromkeys(COUNTED, 0)
    for s in sessions:
        c = s.stats()["counters"]
        for name in COUNTED:
            total[name] += int(c.get(name, 0))
    return total


def _parked_bytes(sessions: list[Any]) -> dict[str, int]:
    tiers: dict[str, int] = {}
    for s in sessions:
        for tier, entry in s.stats()["cold"].items():
            tiers[tier] = tiers.get(tier, 0) + int(entry["bytes"])
    return tiers


def _loop_share(before: dict[str, Any], after: dict[str, Any], wall: float) -> dict[str, float]:
    """Where the backend's step loop spent the timed part: its steps, the engine's decodes inside
    them, and the rest of the wall time (waiting for calls, control calls between steps)."""
    steps = after["steps"] - before["steps"]
    step_s, engine_s = after["step_s"] - before["step_s"], after["engine_s"] - before["engine_s"]
    return {"steps": steps, "step_ms": 1e3 * step_s / max(1, steps), "engine_ms_per_step": 1e3 * engine_s / max(1, steps),
            "tokens_per_step": (after["engine_tokens"] - before["engine_tokens"]) / max(1, steps),
            "engine_share_of_wall": engine_s / wall, "steps_share_of_wall": step_s / wall,
            "commit_ms_per_step": 1e3 * (after["commit_s"] - before["commit_s"]) / max(1, steps)}


def wait_for_probes(manager: Any, backend: str, timeout_s: float = 900.0) -> tuple[str | None, float]:
    """Wait until the backend's background recall-cost probes (a child process that decodes on
    the same cores) are done, so they do not share the timed part; (their status, seconds waited)."""
    import ray

    t0 = time.perf_counter()
    while True:
        status = ray.get(manager.backend(backend).stats_ref()).get("recall_costs")
        if status not in ("idle", "probing") or time.perf_counter() - t0 > timeout_s:
            return status, time.perf_counter() - t0
        time.sleep(0.5)


def kvres_fleet(manager: Any, w: Workload, backend: str, vocab: int, two_calls: bool = False,
                high: int = 0) -> tuple[list[TurnTiming], float, dict[str, Any]]:
    import ray

    from kvres.cluster import SessionPolicy

    # the first ``high`` sessions have priority 1, the others 0 (``failures`` name the session)
    sessions = [manager.open_session(backend=backend, policy=SessionPolicy().with_retention(priority=int(i < high)))
                for i in range(w.sessions)]
    try:
        for i, s in enumerate(sessions):
            s.append(w.history_of(i, vocab))
        probes, waited = wait_for_probes(manager, backend)
        before = _counters(sessions)
        loop_before = ray.get(manager.backend(backend).stats_ref())["loop"]
        timings: list[TurnTiming] = []
        failures: list[str] = []
        lock = threading.Lock()
        t0 = time.perf_counter()

        def user(u: int) -> None:
            for k in range(w.turns):
                for i in w.sessions_of(u):
                    start = time.perf_counter() - t0
                    try:
                        user_turn = w.user_turn(i, k, vocab)
                        if two_calls:
                            sessions[i].append(user_turn)
                            stream = sessions[i].stream(w.reply_tokens, ignore_eos=True)
                        else:
                            stream = sessions[i].stream(w.reply_tokens, ignore_eos=True, prompt=user_turn)
                        first = None
                        n = 0
                        for _ in stream:
                            n += 1
                            if first is None:
                                first = time.perf_counter() - t0
                        if n != w.reply_tokens:
                            raise RuntimeError(f"session {i} turn {k}: {n} reply tokens, not {w.reply_tokens}")
                    except Exception as exc:  # counted, and the run goes on
                        with lock:
                            failures.append(f"session {i} turn {k}: {type(exc).__name__}: {exc}")
                        continue
                    end = time.perf_counter() - t0
                    with lock:
                        timings.append(TurnTiming(i, k, start, first if first is not None else end, end))

        threads = [threading.Thread(target=user, args=(u,)) for u in range(w.users)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.perf_counter() - t0
        after = _counters(sessions)
        stats = ray.get(manager.backend(backend).stats_ref())
        per_turn = {f"{k}_per_turn": (after[k] - before[k]) / max(1, len(timings)) for k in COUNTED}
        extra = {"failed_turns": len(failures), "failed_sessions": sorted({int(f.split()[1]) for f in failures}), "recall_probes": probes, "waited_for_probes_s": waited, "failures": failures[:5], **per_turn,
                 "peak_resident_tokens": stats["peak_resident_tokens"], "kv_budget_tokens": stats["kv_budget_tokens"],
                 "parked_kv_bytes": _parked_bytes(sessions), "loop": _loop_share(loop_before, stats["loop"], wall)}
        return timings, wall, extra
    finally:
        for s in sessions:
            s.close()


def first_turns(manager: Any, w: Workload, backend: str, vocab: int, turns: int = 4) -> dict[str, Any]:
    session = manager.open_session(backend=backend)
    try:
        session.append(w.history_of(0, vocab))
        times = []
        for k in range(turns):
            t0 = time.perf_counter()
            n = sum(1 for _ in session.stream(w.reply_tokens, ignore_eos=True, prompt=w.user_turn(0, k, vocab)))
            times.append(time.perf_counter() - t0)
            if n != w.reply_tokens:
                raise RuntimeError(f"first turns: {n} reply tokens, not {w.reply_tokens}")
    finally:
        session.close()
    later = statistics.median(times[1:])
    return {"turn_s": times, "first_turn_s": times[0], "later_turn_median_s": later, "ratio": times[0] / later}


def open_cost(manager: Any, w: Workload, backend: str, vocab: int, repeats: int) -> dict[str, float]:
    """Median seconds to open a session and append the shared prefix (others already hold it),
    and to open one and append as many tokens that no one shares."""
    shared = w.history_of(0, vocab)[: w.shared_prefix]
    holder = manager.open_session(backend=backend)
    holder.append(shared)
    times: dict[str, list[float]] = {"shared": [], "unshared": []}
    try:
        for r in range(repeats):
            own = [int(t) for t in np.random.default_rng((r, 99)).integers(3, vocab, size=len(shared))]
            for kind, tokens in (("shared", shared), ("unshared", own)):
                t0 = time.perf_counter()
                s = manager.open_session(backend=backend)
                s.append(tokens)
                times[kind].append(time.perf_counter() - t0)
                s.close()
    finally:
        holder.close()
    shared_s, unshared_s = statistics.median(times["shared"]), statistics.median(times["unshared"])
    return {"shared_open_s": shared_s, "unshared_open_s": unshared_s, "ratio": shared_s / unshared_s}
