"""The backend host's typed refusals.

Primitives:
- ``BackendFullError(message, retry_after_s=None)``: the backend cannot make room: its budget is
  taken by sessions it may not evict. A call refused after waiting for room (or because too many
  wait, ``room_queue``) carries ``retry_after_s``, when to try again (HTTP: ``Retry-After``).
- ``TenantQuotaError`` (a ``BackendFullError``): a tenant's sessions cannot fit a call within its
  ``resident_tokens`` quota on the backend.
- ``SessionBusyError``: the session has a call running; the operation must wait for it.
- ``SessionHeldError``: another request holds the session (``holds.Hold``); ``OtherTenantsSessionError``:
  a session another tenant owns (a hold whose fence names another tenant), in an unknown
  session's words, so ids do not leak.
"""

from __future__ import annotations

from kvres.policy import KvresError, UnknownSessionError


class BackendFullError(KvresError):
    """The backend cannot make room: its budget is taken by sessions it may not evict.
    ``retry_after_s``: seconds after which a retry may find room (None: no hint)."""

    def __init__(self, message: str, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s  # kept when pickled (an exception's __dict__ travels with it)


class TenantQuotaError(BackendFullError):
    """A tenant's sessions cannot fit a call within its ``resident_tokens`` quota on the backend
    (``BackendConfig.tenant_quotas``): the rest of its budget is held by its sessions that may not
    be suspended or shrunk (running, pinned, or not evicting)."""


class SessionBusyError(KvresError):
    """The session has a call running (an append or a generate); the operation must wait for it."""


class SessionHeldError(KvresError):
    """Another request holds the session (``holds.Hold``); send this one once it has ended."""


class OtherTenantsSessionError(KvresError):
    """A session another tenant owns: answered with an unknown session's words (and over HTTP its
    404), so ids do not leak. Not an ``UnknownSessionError``: a handle does not go looking for the
    session elsewhere, nor open it again."""

    def __init__(self, session_id: str) -> None:
        super().__init__(str(UnknownSessionError(session_id)))
        self.session_id = session_id

    def __reduce__(self) -> tuple[type[OtherTenantsSessionError], tuple[str]]:
        return type(self), (self.session_id,)
