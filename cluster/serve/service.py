"""One replica's link to kvres: the session manager, the model catalog, the shared state, threads.

Primitives:
- ``Service(namespace, config, digests, max_workers=64, lifetime=SessionLifetime())``: connects to
  the kvres actors of ``namespace`` (Ray is already running in a Serve replica), ``catalog``,
  ``state`` (``ServeState``), ``keys`` (``KeyCheck``), ``lifetime`` (how long the sessions it opens
  live unless a request asks otherwise: ``lifetime.SessionLifetime``); ``run(fn, *args)`` (await a blocking kvres call on the
  replica's own thread pool, so the event loop never waits on Ray); ``close()``.
- ``Service.fenced``: whether requests carry an identity (API keys are configured): then a key's
  requests reach only its own tenant's sessions (``owners.may_use``); another tenant's session
  answers as an unknown one (404), and as a taken id (409) where a request would open it.
- ``Service.open_session(model, backend, session_id=None, tenant=None, lifetime=None) -> Session``:
  on ``backend``, or where placement puts a session of ``model``; ``tenant``: the label of the
  request's API key, whose quotas the session counts against (and who owns it); ``lifetime``: its
  idle and TTL clocks (None: the service's).
- ``Service.session(session_id, tenant, owner=None) -> Session``: an open session the caller's
  tenant owns (``owner``: what the session's lease said of its owner, when one is held);
  ``Service.claim(session_id, tenant)``: a session this front opened or forked is ``tenant``'s.
- ``Service.stateless(model, backend, tenant=None, one_call=False) -> (Session, ExitStack)``: a
  session opened for one request and closed when the stack closes; with ``one_call`` (a turn that
  is one streamed call) an ``EphemeralSession``, which that call opens and closes on the backend.
- ``Service.bound(model, backend, session_id, tenant=None, lifetime=None) -> (Session, ExitStack)``: the
  named session (opened with that id and ``lifetime`` on first use), a ``holds.HeldSession`` under
  the request's hold on its backend until the stack closes (its stream takes the hold in its own
  call; fenced, the hold names the caller's tenant, and a session of another tenant is a 409);
  another request on it meanwhile is refused (409). A session of another model than the one asked
  is a 400. The replica remembers where it ran each session, so a bound turn makes no planner call
  to find it (it follows a session moved meanwhile, and opens again one closed): the turn is one
  call to the backend.
- ``Service.reachable(timeout_s=HEALTH_TIMEOUT_S) -> {model id: {backend: bool}}``: which backends
  answer a ping within ``timeout_s`` (all asked at once), per model (``/health``).
- ``Service.lease(session_id) -> (ExitStack, Owner)``: the session held for the request (the
  sessions routes, the Responses API) until the stack closes, and its owner as its backend says;
  a session no backend has is not held (its open or restore with that id refuses a second one).

Sessions live in the backend actors: any replica serves any session.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from kvres.actors.config import SessionPolicy
from kvres.actors.host.refusals import OtherTenantsSessionError
from kvres.coldstore import validate_session_id
from kvres.policy import SessionExistsError, UnknownSessionError

from ..kvres_config import KvresConfig
from ..session import SessionManager, connect
from ..session_handle import Session
from .auth import KeyCheck
from .catalog import ModelCatalog, ServedModel
from .holds import FrontHolds, HeldSession
from .http_errors import bad_request
from .lifetime import SessionLifetime
from .owners import UNKNOWN, Owner, may_use
from .state_actor import ServeState

T = TypeVar("T")
REMEMBERED_SESSIONS = 100_000  # where this replica ran each session: forgotten all at once past this
log = logging.getLogger("kvres.serve")
HEALTH_TIMEOUT_S = 5.0  # a backend that does not answer a ping in this long counts as unreachable


class Service:
    def __init__(self, namespace: str, config: KvresConfig, digests: tuple[str, ...] = (),
                 max_workers: int = 64, lifetime: SessionLifetime | None = None) -> None:
        self.namespace = namespace
        self.lifetime = lifetime or SessionLifetime()
        self.manager: SessionManager = connect(namespace=namespace, config=config)
        config = self.manager.config
        self.catalog = ModelCatalog(config.backends, keeps_every_token=config.default_policy.residency.keeps_every_token)
        self.state = ServeState(namespace)
        self.keys = KeyCheck(digests)
        self.pool = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="kvres-serve")
        self.holds = FrontHolds(self.manager)
        self._where: dict[str, str] = {}  # session id -> the backend this replica last ran it on

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.wrap_future(self.pool.submit(fn, *args))

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)

    def reachable(self, timeout_s: float = HEALTH_TIMEOUT_S) -> dict[str, dict[str, bool]]:
        import ray

        refs: dict[str, Any] = {}
        for model in self.catalog.models:
            for name in model.backends:
                with contextlib.suppress(Exception):  # gone from the cluster: unreachable
                    refs[name] = self.manager.backend(name).ping_ref()
        answered: set[str] = set()
        if refs:
            ready, _ = ray.wait(list(refs.values()), num_returns=len(refs), timeout=timeout_s)
            ready_ids = {ref.hex() for ref in ready}
            for name, ref in refs.items():
                if ref.hex() in ready_ids:
                    with contextlib.suppress(Exception):  # it died: its ping raised
                        ray.get(ref, timeout=0)
                        answered.add(name)
        return {model.id: {name: name in answered for name in model.backends} for model in self.catalog.models}

    # -- sessions ------------------------------------------------------------------------------
    @property
    def fenced(self) -> bool:
        return not self.keys.open

    def _open(self, model: ServedModel, backend: str | None, session_id: str | None,
              tenant: str | None, lifetime: SessionLifetime | None = None) -> Session:
        lifetime = lifetime or self.lifetime  # a clock of None: the default policy's own
        policy = self.manager.config.default_policy.with_retention(
            tenant=tenant, idle_suspend_s=lifetime.idle_s, ttl_s=lifetime.ttl_s)
        if backend is not None:
            return self.manager.open_session(backend=backend, session_id=session_id, policy=policy)
        return self.manager.open_session(model=str(model.path), session_id=session_id, policy=policy)

    def open_session(self, model: ServedModel, backend: str | None, session_id: str | None = None,
                     tenant: str | None = None, lifetime: SessionLifetime | None = None) -> Session:
        session = self._open(model, backend, session_id, tenant, lifetime)
        self.claim(session.session_id, tenant)
        return session

    def claim(self, session_id: str, tenant: str | None) -> None:
        if self.fenced:
            self.state.claim(session_id, tenant)

    def session(self, session_id: str, tenant: str | None, owner: Owner | None = None) -> Session:
        session = self.manager.session(session_id)
        if not self.fenced:
            return session
        owner = self.state.owner(session_id) if owner is None else owner
        if owner.known:
            owning = owner.tenant
        else:  # opened by a driver, or before the front's state restarted: its policy says
            owning = session.stats()["policy"]["tenant"]
            self.state.claim(session_id, owning)
        if not may_use(owning, tenant):
            raise OtherTenantsSessionError(session_id)
        return session

    def stateless(self, model: ServedModel, backend: str | None, tenant: str | None = None,
                  one_call: bool = False) -> tuple[Session, contextlib.ExitStack]:
        """``one_call``: the turn is one streamed call (``turns.one_call``): its session is ephemeral,
        opened and closed by that call on the backend (no journal record, no directory entry, no
        planner call: ``backend``, else the model's backend, one at random where it has several)."""
        if one_call:
            policy = None if tenant is None else self.manager.config.default_policy.with_retention(tenant=tenant)
            name = backend or random.choice(model.backends)
            return EphemeralSession(self.manager, f"once-{uuid.uuid4().hex}", name, policy), contextlib.ExitStack()
        stack = contextlib.ExitStack()
        session = self._open(model, backend, None, tenant)  # no other request can name it: not claimed
        stack.callback(self.close_quietly, session)
        return session, stack

    def lease(self, session_id: str) -> tuple[contextlib.ExitStack, Owner]:
        validate_session_id(session_id)
        stack = contextlib.ExitStack()
        try:
            held = HeldSession(self.manager, session_id, self._backend_of(session_id), None, self.holds.new(),
                               self.holds)
            tenant = held.take()
        except UnknownSessionError:  # no backend has it (or it closed meanwhile): the call that follows says so
            return stack, UNKNOWN
        stack.callback(held.release)
        return stack, Owner(known=True, tenant=tenant)

    def bound(self, model: ServedModel, backend: str | None, session_id: str, tenant: str | None = None,
              lifetime: SessionLifetime | None = None) -> tuple[Session, contextlib.ExitStack]:
        validate_session_id(session_id)

        def reopen() -> str:
            return self.open_session(model, backend, session_id, tenant, lifetime).backend

        opened = False
        try:
            where = self._backend_of(session_id)
        except UnknownSessionError:
            try:
                where, opened = reopen(), True
            except SessionExistsError:  # another request opened it just now: its hold decides
                where = self._backend_of(session_id)
        session = HeldSession(self.manager, session_id, where, None if opened else reopen,
                              self.holds.new((tenant,) if self.fenced else None), self.holds)
        stack = contextlib.ExitStack()
        stack.callback(session.release)
        stack.callback(self._remember, session)
        if session.backend not in model.backends or (backend is not None and session.backend != backend):
            stack.close()
            raise bad_request(f"session {session_id!r} runs on backend {session.backend!r} "
                              f"(model {self.catalog.of_backend(session.backend).id!r}), not {model.id!r}"
                              + (f" / backend {backend!r}" if backend else ""), param="model")
        return session, stack

    def _backend_of(self, session_id: str) -> str:
        """Where this replica last ran the session (no planner call), else where the planner's
        directory has it (``UnknownSessionError`` where nowhere)."""
        return self._where.get(session_id) or self.manager.session(session_id).backend

    def _remember(self, session: Session) -> None:
        if len(self._where) > REMEMBERED_SESSIONS:
            self._where.clear()
        self._where[session.session_id] = session.backend

    def close_quietly(self, session: Session) -> None:
        try:
            session.close()
        except UnknownSessionError:
            pass
        except Exception as exc:  # the answer is on its way: a session left open is logged, not raised
            log.warning("closing session %r failed: %s: %s", session.session_id, type(exc).__name__, exc)


class EphemeralSession(Session):
    """A stateless turn's session: its one stream opens it on the backend (with ``policy``) and
    closes it as it ends; nothing else is sent for it."""

    def __init__(self, manager: SessionManager, session_id: str, backend: str, policy: SessionPolicy | None) -> None:
        super().__init__(manager, session_id, backend)
        self._opens = (policy,)


__all__ = ["EphemeralSession", "OtherTenantsSessionError", "Service"]
