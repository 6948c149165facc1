"""Calls that wait for room: first come, first served within a priority, for a bounded time.

Primitives:
- ``RoomQueue(name, max_wait_s, max_calls, metrics, clock=time.monotonic)``: a backend's calls that
  could not get room (``BackendConfig.max_room_wait_s``, ``BackendConfig.max_waiting_calls``).
  ``order(jobs, priority)``: the order a step serves calls in (higher ``SessionPolicy.priority``
  first, then arrival); ``wait(job, refusal) -> BackendFullError | None``: the call could not get
  room now: it waits (its clock starts at its first refusal), or, when ``max_calls`` already wait,
  is refused at once (the error returned); ``granted(job)``: it got room, its wait ends;
  ``expired() -> [(job, error)]``: calls that waited past ``max_wait_s``, each with the refusal to
  fail it with (its last refusal's type and reason, how long it waited, the hint); ``prune()``:
  calls that ended otherwise leave it; ``depth``; ``retry_after_s()`` (the hint: the recent wait of
  calls that got room, at least 1 s); ``stats()``; ``counts`` (waited, refused, preempted).

It runs nothing: the step loop's ``JobQueue`` holds the calls, and a step asks this queue who goes
first, and notes here who waits, who got room and who waited too long (under the host's lock).
Queue depth and waits go to the metrics (``kvres_room_queue_depth``, ``kvres_room_wait_seconds``).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..metrics import Metrics
from .refusals import BackendFullError
from .scheduler import Job

WAIT_SMOOTHING = 0.2  # weight of the newest wait in the retry-after hint's moving average
MIN_RETRY_AFTER_S = 1.0


@dataclass
class _Waiting:
    since: float
    refusal: BackendFullError


class RoomQueue:
    def __init__(self, name: str, max_wait_s: float, max_calls: int, metrics: Metrics,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.name = name
        self.max_wait_s = max_wait_s
        self.max_calls = max_calls
        self._metrics = metrics
        self._clock = clock
        self._waiting: dict[Job, _Waiting] = {}
        self._recent_wait_s = 0.0  # moving average of the waits of calls that got room
        self._shown_depth = 0
        self.counts = {"waited": 0, "refused": 0, "preempted": 0}
        self.wait_s = 0.0  # summed waits of calls that got room
        self.max_seen_s = 0.0  # the longest wait of a call that got room
        metrics.set_room_queue_depth(name, 0)  # the series exists from the start

    @property
    def depth(self) -> int:
        return len(self._waiting)

    def order(self, jobs: list[Job], priority: Callable[[Job], int]) -> list[Job]:
        return sorted(jobs, key=lambda job: -priority(job))  # stable: arrival order within a priority

    def wait(self, job: Job, refusal: BackendFullError) -> BackendFullError | None:
        entry = self._waiting.get(job)
        if entry is not None:
            entry.refusal = refusal
            return None
        if len(self._waiting) >= self.max_calls or self.max_wait_s <= 0:
            self.counts["refused"] += 1
            self._metrics.observe_room_wait(self.name, 0.0, "refused")
            limit = (f"max_waiting_calls={self.max_calls} calls already wait for room" if self.max_wait_s > 0
                     else "max_room_wait_s=0: calls do not wait for room")
            return self._refusal(refusal, f"{limit}; retry after about {self.retry_after_s():.0f} s")
        self._waiting[job] = _Waiting(self._clock(), refusal)
        self._show()
        return None

    def granted(self, job: Job) -> None:
        entry = self._waiting.pop(job, None)
        if entry is None:
            return
        waited = self._clock() - entry.since
        self.counts["waited"] += 1
        self.wait_s += waited
        self.max_seen_s = max(self.max_seen_s, waited)
        self._recent_wait_s += WAIT_SMOOTHING * (waited - self._recent_wait_s)
        self._metrics.observe_room_wait(self.name, waited, "room")
        self._show()

    def prune(self) -> None:
        """Calls that ended while they waited (closed, cancelled, failed) leave the queue."""
        for job in [job for job in self._waiting if job.done]:
            del self._waiting[job]
        self._show()

    def expired(self) -> list[tuple[Job, BackendFullError]]:
        """Calls that waited past ``max_wait_s``, taken out of the queue (and ``prune``)."""
        self.prune()
        now = self._clock()
        out: list[tuple[Job, BackendFullError]] = []
        for job, entry in list(self._waiting.items()):
            if now - entry.since > self.max_wait_s:
                del self._waiting[job]
                self.counts["refused"] += 1
                self._metrics.observe_room_wait(self.name, now - entry.since, "refused")
                out.append((job, self._refusal(
                    entry.refusal, f"no room came within max_room_wait_s={self.max_wait_s:g} (waited "
                    f"{now - entry.since:.1f} s); retry after about {self.retry_after_s():.0f} s")))
        self._show()
        return out

    def retry_after_s(self) -> float:
        return float(max(MIN_RETRY_AFTER_S, math.ceil(self._recent_wait_s)))

    def _refusal(self, refusal: BackendFullError, why: str) -> BackendFullError:
        return type(refusal)(f"{refusal}; {why}", retry_after_s=self.retry_after_s())

    def _show(self) -> None:
        if len(self._waiting) != self._shown_depth:
            self._shown_depth = len(self._waiting)
            self._metrics.set_room_queue_depth(self.name, self._shown_depth)

    def stats(self) -> dict[str, Any]:
        return {"waiting": len(self._waiting), **self.counts, "wait_s": self.wait_s, "max_wait_s": self.max_seen_s,
                "retry_after_s": self.retry_after_s(), "max_room_wait_s": self.max_wait_s,
                "max_waiting_calls": self.max_calls}
