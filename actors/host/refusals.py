"""The backend host's typed refusals.

Primitives:
- ``BackendFullError``: the backend cannot make room: its budget is taken by sessions it may not evict.
- ``TenantQuotaError`` (a ``BackendFullError``): a tenant's sessions cannot fit a call within its
  ``resident_tokens`` quota on the backend.
- ``SessionBusyError``: the session has a call running; the operation must wait for it.
"""

from __future__ import annotations

from kvres.policy import KvresError


class BackendFullError(KvresError):
    """The backend cannot make room: its budget is taken by sessions it may not evict."""


class TenantQuotaError(BackendFullError):
    """A tenant's sessions cannot fit a call within its ``resident_tokens`` quota on the backend
    (``BackendConfig.tenant_quotas``): the rest of its budget is held by its sessions that may not
    be suspended or shrunk (running, pinned, or not evicting)."""


class SessionBusyError(KvresError):
    """The session has a call running (an append or a generate); the operation must wait for it."""
