"""Who may run a request on a session now: one holder at a time, the others refused (409).

Primitives:
- ``SessionLeases(clock=time.monotonic)``: ``acquire(key, holder, ttl_s) -> bool`` (True when free,
  expired, or already this holder's), ``renew(held: {key: holder}, ttl_s)``, ``release(key,
  holder)`` (only the holder's own lease), ``holder(key)``.

A lease expires ``ttl_s`` after it was taken or last renewed: a replica that died holding one
frees its sessions once that time has passed (replicas renew the leases they hold while they
run). The leases live in the serve state actor (``state_actor``), one for the whole application.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping


class SessionLeases:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._held: dict[str, tuple[str, float]] = {}

    def holder(self, key: str) -> str | None:
        held = self._held.get(key)
        if held is None or held[1] <= self._clock():
            return None
        return held[0]

    def acquire(self, key: str, holder: str, ttl_s: float) -> bool:
        if ttl_s <= 0:
            raise ValueError(f"ttl_s must be > 0, got {ttl_s}")
        current = self.holder(key)
        if current is not None and current != holder:
            return False
        self._held[key] = (holder, self._clock() + ttl_s)
        return True

    def renew(self, held: Mapping[str, str], ttl_s: float) -> None:
        until = self._clock() + ttl_s
        for key, holder in held.items():
            if self.holder(key) == holder:
                self._held[key] = (holder, until)

    def release(self, key: str, holder: str) -> None:
        held = self._held.get(key)
        if held is not None and held[0] == holder:
            del self._held[key]
