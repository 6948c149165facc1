"""A request's hold on its session, taken on the session's backend: one request per session at a time.

Primitives:
- ``FrontHolds(manager)``: this front's holds (``kvres.actors.host.holds``): ``new(fence=None) ->
  Hold`` (a fresh holder, ``HOLD_TTL_S``), ``take(session, hold) -> tenant`` (the session's
  backend takes it for ``hold``, asked again for ``RELEASE_GRACE_S`` while another request holds
  it, then ``SessionLockedError``), ``kept(session_id, backend, hold)`` (renewed every
  ``RENEW_EVERY_S`` until released), ``release(session_id, backend, holder)`` (sent without
  waiting), ``release_kept(session_id, holder)`` (no longer renewed: the backend released it).
- ``HeldSession(manager, session_id, backend, reopen, hold, holds)``: a bound request's session
  handle: its streams take the hold in their own call (a bound turn is one call to the backend:
  hold, lookup and turn together), any other call takes it first, once (``take() -> tenant``);
  ``release()`` at the request's end sends the release unless the stream that took it ended whole
  (the backend released it then). ``reopen`` (None for a session the request has just opened): where
  its backend does not have it and the planner's directory has it nowhere else (closed meanwhile,
  or listed by an opener that died before its backend opened it), it is opened again, once, as a
  session's first use opens it; the handle follows a session another handle moved.
- ``retry_held(start, session_id)``: ``start()`` asked again for ``RELEASE_GRACE_S`` while it raises
  ``SessionHeldError``, then ``SessionLockedError`` (409); a hold fenced off another tenant's
  session (``OtherTenantsSessionError``) is a 409 ``session_exists``.

Why on the backend: the serve state actor held the leases, so a bound turn made a Ray call to it
(and a release after) before its call to the backend: on two cores ~4 ms p50 (10+ at p90) of the
turn's time to first token and ~2 ms of CPU. The backend serves the session, so the call that runs
the turn can take its hold. What the state actor's leases did that these do not: a lease survived
a backend's death (a hold is lost with the backend's process: its calls are repeated there after a
restart, taking it again), and a session moved to another backend is held there from the request's
next call on.
"""

from __future__ import annotations

import contextlib
import threading
import time
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

from kvres.actors.host.holds import Hold
from kvres.actors.host.refusals import OtherTenantsSessionError, SessionHeldError

from ..session_handle import Session
from .http_errors import ApiError, SessionLockedError

if TYPE_CHECKING:
    from ..backend_client import BackendClient, TokenStream
    from ..session import SessionManager

T = TypeVar("T")
HOLD_TTL_S = 20.0  # a dead front's sessions are free again this long after it died
RENEW_EVERY_S = 4.0  # a live front renews what it holds five times per TTL
# A client that sends its next turn as soon as the last one's answer (or [DONE]) arrived can reach
# the backend before that request's release does (another front's, or a release still on its way):
# a request that finds its session held asks again for this long before it answers 409.
RELEASE_GRACE_S = 0.25
RELEASE_POLL_S = 0.02


def retry_held(start: Callable[[], T], session_id: str) -> T:
    waited_until = None
    while True:
        try:
            return start()
        except OtherTenantsSessionError:  # only a bound request's hold names a tenant (a fence)
            raise ApiError(409, f"session id {session_id!r} is taken by a session another API key's tenant owns; "
                                "bind this conversation to another X-Session-Id",
                           param="X-Session-Id", code="session_exists") from None
        except SessionHeldError:
            now = time.monotonic()
            waited_until = now + RELEASE_GRACE_S if waited_until is None else waited_until
            if now >= waited_until:
                raise SessionLockedError(
                    f"session {session_id!r} has a request running; send this one once it has ended") from None
            time.sleep(RELEASE_POLL_S)  # the request before it may have answered and not yet released


class FrontHolds:
    def __init__(self, manager: SessionManager) -> None:
        self._manager = manager
        self._kept: dict[tuple[str, str], str] = {}  # (session id, holder) -> backend
        self._lock = threading.Lock()
        self._renewer: threading.Thread | None = None

    @staticmethod
    def new(fence: tuple[str | None] | None = None) -> Hold:
        return Hold(uuid.uuid4().hex, HOLD_TTL_S, fence)

    def take(self, session: HeldSession, hold: Hold) -> str | None:
        tenant = retry_held(lambda: session.hold(hold), session.session_id)
        self.kept(session.session_id, session.backend, hold)
        return tenant

    def kept(self, session_id: str, backend: str, hold: Hold) -> None:
        with self._lock:
            self._kept[(session_id, hold.holder)] = backend
            if self._renewer is None or not self._renewer.is_alive():
                self._renewer = threading.Thread(target=self._renew_loop, name="kvres-serve-holds", daemon=True)
                self._renewer.start()

    def release_kept(self, session_id: str, holder: str) -> None:
        """No longer renewed (the backend released it already)."""
        with self._lock:
            self._kept.pop((session_id, holder), None)

    def release(self, session_id: str, backend: str, holder: str) -> None:
        self.release_kept(session_id, holder)
        with contextlib.suppress(Exception):  # a backend gone took its holds with it; a live one's expire
            self._manager.backend(backend).release_hold(session_id, holder)

    def _renew_loop(self) -> None:
        stop = threading.Event()
        while not stop.wait(RENEW_EVERY_S):
            with self._lock:
                if not self._kept:  # nothing held: this thread ends; the next hold starts another
                    self._renewer = None
                    return
                by_backend: dict[str, dict[str, str]] = {}
                for (session_id, holder), backend in self._kept.items():
                    by_backend.setdefault(backend, {})[session_id] = holder
            for backend, held in by_backend.items():
                with contextlib.suppress(Exception):  # its holds expire; the next renewal tries again
                    self._manager.backend(backend).renew_holds(held, HOLD_TTL_S)


class HeldSession(Session):
    """A bound request's session, under the request's hold on its backend (module docstring)."""

    def __init__(self, manager: SessionManager, session_id: str, backend: str, reopen: Callable[[], str] | None,
                 hold: Hold, holds: FrontHolds) -> None:
        super().__init__(manager, session_id, backend)
        self._reopen = reopen
        self._hold = hold
        self._holds = holds
        self._held_on: str | None = None  # the backend a call of its own took the hold on
        self._carried: list[TokenStream] = []  # the streams that took it in their call

    def _followed(self) -> BackendClient | None:
        """Where the backend it was remembered on no longer has it: where the directory says (another
        handle moved it), else opened again (``reopen``, once), as a session's first use opens it."""
        client = super()._followed()
        if client is not None or self._reopen is None:
            return client
        reopen, self._reopen = self._reopen, None
        self.backend = reopen()
        return self._backend

    def _end_stream(self, changes: bool = True) -> None:
        """Only this handle's own unfinished stream: another request's stream of the session (in
        this front's process too) is that request's, which holds the session; this one's call is
        refused while it does."""
        super()._end_stream(changes=False)

    def take(self) -> str | None:
        """The hold taken now, by a call of its own (``FrontHolds.take``); the session's tenant."""
        tenant = self._holds.take(self, self._hold)
        self._held_on = self.backend
        return tenant

    def _call(self, op: Callable[[], T], changes: bool = True) -> T:
        if self._held_on != self.backend:
            self.take()
        return super()._call(op, changes)

    def hold(self, hold: Hold) -> str | None:
        return super()._call(lambda: self._backend.hold(self.session_id, hold), changes=False)

    def _opening(self) -> dict[str, object]:
        opening = super()._opening()
        if self._held_on != self.backend:
            opening["hold"] = self._hold
        return opening

    def _made(self, stream: TokenStream) -> TokenStream:
        if self._held_on != self.backend:
            self._carried.append(stream)
            self._holds.kept(self.session_id, self.backend, self._hold)
        return super()._made(stream)

    def release(self) -> None:
        """The request ended: its hold released where it still stands."""
        if self._held_on is None and all(stream.released for stream in self._carried):
            self._holds.release_kept(self.session_id, self._hold.holder)
            return
        self._holds.release(self.session_id, self._held_on or self.backend, self._hold.holder)
