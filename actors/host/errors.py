"""The backend host's typed refusals.

Primitives:
- ``BackendFullError``: the backend cannot make room: its budget is taken by sessions it may not evict.
- ``SessionBusyError``: the session has a call running; the operation must wait for it.
"""

from __future__ import annotations

from kvres.policy import KvresError


class BackendFullError(KvresError):
    """The backend cannot make room: its budget is taken by sessions it may not evict."""


class SessionBusyError(KvresError):
    """The session has a call running (an append or a generate); the operation must wait for it."""
