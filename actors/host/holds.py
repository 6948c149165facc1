"""Who may run a request on a session now: one holder at a time, the others refused.

Primitives:
- ``Hold(holder, ttl_s, fence=None)``: what a call that takes a session for a request carries: the
  request's ``holder`` id, how long the hold lasts unless renewed, and ``fence`` (``(tenant,)``:
  the caller's tenant, where the caller fences sessions by tenant; None: no check).
- ``SessionHolds(clock=time.monotonic)``: ``acquire(key, holder, ttl_s) -> bool`` (True when free,
  expired, or already this holder's), ``renew(held: {key: holder}, ttl_s)``, ``release(key,
  holder)`` (only the holder's own hold), ``holder(key)``; thread-safe.

A hold expires ``ttl_s`` after it was taken or last renewed: a front that died holding one frees
its sessions once that time has passed (fronts renew the holds they keep while they run). The
holds of a session live in the shell of the backend that serves it (``BackendServer.hold``), so
that the call that runs a turn takes its session's hold in the same call; a call made without a
``Hold`` (a driver's) is not checked against them, the backend's own refusal of a second call on a
busy session (``SessionBusyError``) still applies.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class Hold:
    holder: str
    ttl_s: float
    fence: tuple[str | None] | None = None

    def __post_init__(self) -> None:
        if not self.ttl_s > 0:
            raise ValueError(f"a hold's ttl_s must be > 0, got {self.ttl_s}")


class SessionHolds:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._held: dict[str, tuple[str, float]] = {}
        self._lock = threading.Lock()

    def holder(self, key: str) -> str | None:
        with self._lock:
            return self._holder(key)

    def _holder(self, key: str) -> str | None:
        held = self._held.get(key)
        if held is None or held[1] <= self._clock():
            return None
        return held[0]

    def acquire(self, key: str, holder: str, ttl_s: float) -> bool:
        if ttl_s <= 0:
            raise ValueError(f"ttl_s must be > 0, got {ttl_s}")
        with self._lock:
            current = self._holder(key)
            if current is not None and current != holder:
                return False
            self._held[key] = (holder, self._clock() + ttl_s)
            if len(self._held) > 1024:
                self._drop_expired()
            return True

    def renew(self, held: Mapping[str, str], ttl_s: float) -> None:
        with self._lock:
            until = self._clock() + ttl_s
            for key, holder in held.items():
                if self._holder(key) == holder:
                    self._held[key] = (holder, until)

    def release(self, key: str, holder: str) -> None:
        with self._lock:
            held = self._held.get(key)
            if held is not None and held[0] == holder:
                del self._held[key]

    def _drop_expired(self) -> None:
        now = self._clock()
        for key in [k for k, (_, until) in self._held.items() if until <= now]:
            del self._held[key]
