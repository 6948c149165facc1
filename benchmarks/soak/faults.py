"""The soak's fault schedule: each of the six kinds of fault, SIGKILL of the actor's process, in turn.

Primitives:
- ``Fault(kind, planned_s)``: one kill; once made, ``pid`` and ``at_s`` (the run's clock), or
  ``error`` where it could not be made.
- ``schedule(kinds, each, start_s, end_s) -> list[Fault]``: ``each`` rounds of ``kinds`` in that
  order, planned at even intervals from ``start_s`` to ``end_s``.
- ``Injector(faults, kill, clock, recovered_after, settle_s)``: a thread that makes each fault at
  its planned time, but never before the previous one recovered (``recovered_after(at_s)``: some
  turn started after that kill completed) and ``settle_s`` passed since, so two faults never
  overlap and each one's window after it is its own (a late fault is made late: ``at_s`` says when);
  a fault whose predecessor never recovers waits at most ``MAX_WAIT_S``. ``start()``,
  ``done()`` (every fault made), ``stop()``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

MAX_WAIT_S = 300.0


@dataclass
class Fault:
    kind: str
    planned_s: float
    pid: int | None = None
    at_s: float | None = None
    error: str = ""


def schedule(kinds: Sequence[str], each: int, start_s: float, end_s: float) -> list[Fault]:
    if each < 0:
        raise ValueError(f"faults of each kind must be >= 0, got {each}")
    order = [kind for _ in range(each) for kind in kinds]
    if not order:
        return []
    step = (end_s - start_s) / max(1, len(order) - 1)
    return [Fault(kind, start_s + i * step) for i, kind in enumerate(order)]


class Injector:
    def __init__(self, faults: list[Fault], kill: Callable[[str], tuple[int, float]], clock: Callable[..., float],
                 recovered_after: Callable[[float], float | None], settle_s: float = 5.0) -> None:
        self.faults, self.kill, self.clock, self.recovered_after = faults, kill, clock, recovered_after
        self.settle_s = settle_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="soak-faults", daemon=True)

    def start(self) -> Injector:
        self._thread.start()
        return self

    def done(self) -> bool:
        return all(f.at_s is not None or f.error for f in self.faults)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=MAX_WAIT_S)

    def _ready(self, previous: Fault | None, waited_since: float) -> bool:
        if previous is None or previous.at_s is None:
            return True
        if time.monotonic() - waited_since > MAX_WAIT_S:
            return True
        recovered = self.recovered_after(previous.at_s)
        return recovered is not None and self.clock() >= recovered + self.settle_s

    def _run(self) -> None:
        previous: Fault | None = None
        for fault in self.faults:
            while not self._stop.is_set() and self.clock() < fault.planned_s:
                self._stop.wait(0.2)
            since = time.monotonic()
            while not self._stop.is_set() and not self._ready(previous, since):
                self._stop.wait(0.2)
            if self._stop.is_set():
                return
            try:
                fault.pid, at = self.kill(fault.kind)
                fault.at_s = self.clock(at)
                print(f"soak: {fault.kind} killed (pid {fault.pid}) at {fault.at_s:.1f} s", flush=True)
            except Exception as exc:  # reported in the results; the schedule goes on
                fault.error = f"{type(exc).__name__}: {exc}"[:300]
                print(f"soak: {fault.kind} not killed: {fault.error}", flush=True)
            previous = fault
