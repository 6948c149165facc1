"""Which tenant owns a session, as the HTTP front last learned it: a cache in front of the backend.

Primitives:
- ``Owner``: ``known`` (whether the cache holds the session) and ``tenant`` (its label; None for
  a session of no tenant).
- ``SessionOwners(max_entries=200_000)``: ``get(session_id) -> Owner``, ``set(session_id,
  tenant)``, ``drop(session_id)``. Past ``max_entries`` the longest-unused entries are dropped.
- ``may_use(owner_tenant, caller_tenant) -> bool``: the rule: a key's requests reach only the
  sessions and stored responses of its own tenant (a key without one: those of no tenant).

The source of truth is the session's policy on its backend (``SessionPolicy.tenant``, fixed when
the session opens); a session this cache does not hold, or forgot, is looked up there once.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass


@dataclass(frozen=True)
class Owner:
    known: bool
    tenant: str | None = None


UNKNOWN = Owner(known=False)


def may_use(owner_tenant: str | None, caller_tenant: str | None) -> bool:
    return owner_tenant == caller_tenant


class SessionOwners:
    def __init__(self, max_entries: int = 200_000) -> None:
        if max_entries < 1:
            raise ValueError(f"max_entries must be >= 1, got {max_entries}")
        self.max_entries = max_entries
        self._tenants: OrderedDict[str, str | None] = OrderedDict()

    def get(self, session_id: str) -> Owner:
        if session_id not in self._tenants:
            return UNKNOWN
        self._tenants.move_to_end(session_id)
        return Owner(known=True, tenant=self._tenants[session_id])

    def set(self, session_id: str, tenant: str | None) -> None:
        self._tenants[session_id] = tenant
        self._tenants.move_to_end(session_id)
        while len(self._tenants) > self.max_entries:
            self._tenants.popitem(last=False)

    def drop(self, session_id: str) -> None:
        self._tenants.pop(session_id, None)

    def __len__(self) -> int:
        return len(self._tenants)
