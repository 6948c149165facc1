"""Simulated backends: what the planner sees of a real one, without an engine.

Primitives:
- ``SimBackend(name, model, budget_tokens, n_seq_max, node, labels, limiter)``: sessions as
  resident ranges that grow at every ``step``; over a budget it plans in its own process with the
  real ``plan_backend`` (evictions, suspensions) and carries the plan out on its ranges;
  ``report(at)`` is its ``LoadReport``; ``stats()`` what the old placement asked every backend.
- ``SimHost``: a Ray actor holding many ``SimBackend``s (one process per host, not per backend:
  200 worker processes would not fit on a small machine) and stepping them on a thread; each
  backend pushes its load to the planner through its own ``ReportLimiter``, fire and forget.
  ``open(backend, session_id, budget)``, ``close``, ``stats(backend)``, ``counters()``, ``stop()``.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

import ray

from kvres.policy import Capabilities, Range, StreamPolicy
from kvres.policy.backend_planner import BackendPlanInput, SessionView, plan_backend
from kvres.policy.placement import LoadReport, ReportLimiter
from kvres.policy.ranges import subtract_range

CAPS = Capabilities(remove_middle=True, position_shift=True, kv_export=True)
STREAM = StreamPolicy(True, 4, 64)


@dataclass
class SimSession:
    budget: int
    ranges: list[Range] = field(default_factory=list)
    length: int = 0  # tokens in the log
    last_used: int = 0
    suspended: bool = False


class SimBackend:
    def __init__(self, name: str, model: str, budget_tokens: int, n_seq_max: int, node: str,
                 labels: dict[str, str], limiter: ReportLimiter) -> None:
        self.name, self.model, self.budget, self.n_seq_max = name, model, budget_tokens, n_seq_max
        self.node, self.labels, self.limiter = node, labels, limiter
        self.sessions: dict[str, SimSession] = {}
        self.clock = 0
        self.plans = 0
        self.plan_seconds = 0.0

    def live(self) -> list[str]:
        return [sid for sid, s in self.sessions.items() if not s.suspended]

    def resident(self) -> int:
        return sum(len(r) for s in self.sessions.values() if not s.suspended for r in s.ranges)

    def open(self, session_id: str, budget: int) -> None:
        live = self.live()
        if len(live) >= self.n_seq_max:  # every slot taken: the least recently used goes
            self.sessions[min(live, key=lambda sid: self.sessions[sid].last_used)].suspended = True
        self.clock += 1
        self.sessions[session_id] = SimSession(budget, last_used=self.clock)

    def close(self, session_id: str) -> None:
        self.sessions.pop(session_id, None)

    def step(self, tokens: int) -> None:
        """Every live session decodes ``tokens`` tokens; room is planned in-process first."""
        live = self.live()
        if not live:
            return
        self.clock += 1
        over = self.resident() + tokens * len(live) > self.budget or any(
            sum(len(r) for r in self.sessions[sid].ranges) + tokens > self.sessions[sid].budget for sid in live)
        if over:
            views = [SessionView(sid, tuple(self.sessions[sid].ranges), self.sessions[sid].last_used, True, tokens,
                                 self.sessions[sid].budget, STREAM, True) for sid in live]
            t0 = time.perf_counter()
            plan = plan_backend(BackendPlanInput(views, self.budget, CAPS))
            self.plan_seconds += time.perf_counter() - t0
            self.plans += 1
            for action in plan.actions:
                s = self.sessions[action.session_id]
                if action.kind == "suspend":
                    s.suspended = True
                    continue
                for cut in action.ranges:
                    s.ranges = subtract_range(s.ranges, cut)
        for sid in self.live():
            s = self.sessions[sid]
            s.ranges = _merged([*s.ranges, Range(s.length, s.length + tokens)])
            s.length += tokens
            s.last_used = self.clock

    def report(self, at: float) -> LoadReport:
        live = self.live()
        return LoadReport(self.name, self.budget, self.resident(), live_sessions=len(live),
                          suspended_sessions=len(self.sessions) - len(live), n_seq_max=self.n_seq_max,
                          model=self.model, engine="sim", node=self.node, labels=self.labels, at=at)

    def stats(self) -> dict[str, Any]:
        return {"backend": self.name, "model": self.model, "free_tokens": self.budget - self.resident()}


def _merged(ranges: list[Range]) -> list[Range]:
    out: list[Range] = []
    for r in sorted(ranges):
        if out and r.start <= out[-1].end:
            out[-1] = Range(out[-1].start, max(out[-1].end, r.end))
        elif not r.empty:
            out.append(r)
    return out


class SimHostServer:
    def __init__(self, host: str, backends: list[dict[str, Any]], planner: Any, step_s: float,
                 tokens_per_step: int, limiter: dict[str, float]) -> None:
        self.host, self.planner, self.step_s, self.tokens = host, planner, step_s, tokens_per_step
        self.backends = {b["name"]: SimBackend(b["name"], b["model"], b["budget_tokens"], b["n_seq_max"], host,
                                               b["labels"], ReportLimiter(**limiter)) for b in backends}
        self.pushes = 0
        self.steps = 0
        self.lock = threading.Lock()
        self.running = True
        now = time.monotonic()
        for b in self.backends.values():  # the first report: the planner learns node and labels
            self._push(b, now)
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _push(self, backend: SimBackend, now: float) -> None:
        report = backend.report(time.time())
        if backend.limiter.offer(report, now):
            self.planner.report_load.remote(report)
            self.pushes += 1
        else:
            held = backend.limiter.held(now)
            if held is not None:
                self.planner.report_load.remote(held)
                self.pushes += 1

    def _run(self) -> None:
        while self.running:
            t0 = time.monotonic()
            with self.lock:
                for b in self.backends.values():
                    b.step(self.tokens)
                    self._push(b, time.monotonic())
                self.steps += 1
            time.sleep(max(0.0, self.step_s - (time.monotonic() - t0)))

    def open(self, backend: str, session_id: str, budget: int) -> None:
        with self.lock:
            b = self.backends[backend]
            b.open(session_id, budget)
            self._push(b, time.monotonic())

    def close(self, backend: str, session_id: str) -> None:
        with self.lock:
            b = self.backends[backend]
            b.close(session_id)
            self._push(b, time.monotonic())

    def stats(self, backend: str) -> dict[str, Any]:
        with self.lock:
            return self.backends[backend].stats()

    def counters(self) -> dict[str, Any]:
        with self.lock:
            return {
                "pushes": self.pushes, "steps": self.steps,
                "plans": sum(b.plans for b in self.backends.values()),
                "plan_seconds": sum(b.plan_seconds for b in self.backends.values()),
                "sessions": {name: list(b.sessions) for name, b in self.backends.items()},
            }

    def stop(self) -> None:
        self.running = False
        self.thread.join()


SimHost = ray.remote(num_cpus=0, max_concurrency=4)(SimHostServer)
