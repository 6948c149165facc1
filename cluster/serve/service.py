"""One replica's link to kvres: the session manager, the model catalog, the shared state, threads.

Primitives:
- ``Service(namespace, config, digests, max_workers=64)``: connects to the kvres actors of
  ``namespace`` (Ray is already running in a Serve replica), ``catalog``, ``state``
  (``ServeState``), ``keys`` (``KeyCheck``); ``run(fn, *args)`` (await a blocking kvres call on the
  replica's own thread pool, so the event loop never waits on Ray); ``close()``.
- ``Service.open_session(model, backend, session_id=None, tenant=None) -> Session``: on ``backend``,
  or where placement puts a session of ``model``; ``tenant``: the label of the request's API key,
  whose quotas the session counts against.
- ``Service.stateless(model, backend, tenant=None) -> (Session, ExitStack)``: a session opened for one
  request and closed when the stack closes.
- ``Service.bound(model, backend, session_id, tenant=None) -> (Session, ExitStack)``: the named session
  (opened with that id on first use), held under its lease until the stack closes; another request
  on it meanwhile is refused (409). A session of another model than the one asked is a 400.
- ``Service.lease(session_id) -> ExitStack``: the session's lease alone (for the sessions routes).

Sessions live in the backend actors: any replica serves any session.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from kvres.coldstore import validate_session_id
from kvres.policy import UnknownSessionError

from ..config import KvresConfig
from ..session import SessionManager, connect
from ..session_handle import Session
from .auth import KeyCheck
from .catalog import ModelCatalog, ServedModel
from .errors import bad_request
from .state_actor import ServeState

T = TypeVar("T")
log = logging.getLogger("kvres.serve")


class Service:
    def __init__(self, namespace: str, config: KvresConfig, digests: tuple[str, ...] = (),
                 max_workers: int = 64) -> None:
        self.namespace = namespace
        self.manager: SessionManager = connect(namespace=namespace, config=config)
        self.catalog = ModelCatalog(self.manager.config.backends)
        self.state = ServeState(namespace)
        self.keys = KeyCheck(digests)
        self.pool = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="kvres-serve")

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.wrap_future(self.pool.submit(fn, *args))

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)

    # -- sessions ------------------------------------------------------------------------------
    def open_session(self, model: ServedModel, backend: str | None, session_id: str | None = None,
                     tenant: str | None = None) -> Session:
        policy = None if tenant is None else self.manager.config.default_policy.with_retention(tenant=tenant)
        if backend is not None:
            return self.manager.open_session(backend=backend, session_id=session_id, policy=policy)
        return self.manager.open_session(model=str(model.path), session_id=session_id, policy=policy)

    def stateless(self, model: ServedModel, backend: str | None,
                  tenant: str | None = None) -> tuple[Session, contextlib.ExitStack]:
        stack = contextlib.ExitStack()
        session = self.open_session(model, backend, tenant=tenant)
        stack.callback(self.close_quietly, session)
        return session, stack

    def lease(self, session_id: str) -> contextlib.ExitStack:
        validate_session_id(session_id)
        stack = contextlib.ExitStack()
        stack.enter_context(self.state.lease(session_id))
        return stack

    def bound(self, model: ServedModel, backend: str | None, session_id: str,
              tenant: str | None = None) -> tuple[Session, contextlib.ExitStack]:
        stack = self.lease(session_id)
        try:
            try:
                session = self.manager.session(session_id)
            except UnknownSessionError:
                session = self.open_session(model, backend, session_id, tenant)
            if session.backend not in model.backends or (backend is not None and session.backend != backend):
                raise bad_request(f"session {session_id!r} runs on backend {session.backend!r} "
                                  f"(model {self.catalog.of_backend(session.backend).id!r}), not {model.id!r}"
                                  + (f" / backend {backend!r}" if backend else ""), param="model")
            return session, stack
        except BaseException:
            stack.close()
            raise

    def close_quietly(self, session: Session) -> None:
        try:
            session.close()
        except UnknownSessionError:
            pass
        except Exception as exc:  # the answer is on its way: a session left open is logged, not raised
            log.warning("closing session %r failed: %s: %s", session.session_id, type(exc).__name__, exc)
