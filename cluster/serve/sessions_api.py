"""``/v1/sessions``: kvres's sessions over HTTP (kvres's own API, not OpenAI's).

Primitives:
- ``router``: ``GET /v1/sessions`` (the open sessions and their backends, in id order, a page at a
  time: ``limit``, default ``DEFAULT_LIST_LIMIT``, at most ``MAX_LIST_LIMIT``; ``after``, the last
  id of the page before; the answer's ``has_more`` and ``last_id`` say where the next page starts), ``GET
  /v1/sessions/{id}`` (the backend's stats: state, token count, resident ranges, cold blocks,
  counters; and ``http``: the turns, prefilled, cached and completion tokens the HTTP front
  counted for it), ``GET /v1/sessions/{id}/tokens`` (its token log, and as text with the control
  tokens), ``DELETE /v1/sessions/{id}`` (closed; the stored responses that named it are
  forgotten), ``POST /v1/sessions/{id}/suspend``, ``/resume`` (answers the tokens recomputed),
  ``/fork`` (body ``{"new_id": ...}``, optional), ``/rollback`` (body ``{"count": n}``), ``/export``
  (the session file's bytes, ``application/octet-stream``, authenticated with the cluster's block
  secret) and ``/restore`` (those bytes as the body: a session of this id on this cluster).

Every call but ``GET`` and ``DELETE`` holds the session's lease (409 while a turn runs on it);
``DELETE`` closes the session even then (its running call ends). Where API keys are configured, a
key sees and touches only its own tenant's sessions (``Service.fenced``): the list leaves the others
out, and each route answers another tenant's session as an unknown one (404); ``/restore`` refuses
a file exported from another tenant's session (400).
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Callable
from typing import Any

import ray
from fastapi import APIRouter
from pydantic import BaseModel, ConfigDict, StrictInt, StrictStr
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from kvres.coldstore import validate_session_id
from kvres.coldstore.session_file import peek_session

from ..session_handle import Session
from .http_errors import bad_request
from .http_glue import answers_errors, parse, service_of, tenant_of
from .owners import may_use
from .service import Service

router = APIRouter()
MAX_SESSION_FILE = 1 << 30
LIST_TIMEOUT_S = 30.0  # a backend's stats for the fenced list
DEFAULT_LIST_LIMIT = 100
MAX_LIST_LIMIT = 1000


class ForkBody(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    new_id: StrictStr | None = None


class RollbackBody(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    count: StrictInt


def _summary(session_id: str, backend: str, **more: Any) -> dict[str, Any]:
    return {"id": session_id, "object": "session", "backend": backend, **more}


@router.get("/v1/sessions")
@answers_errors
async def list_sessions(request: Request) -> Response:
    service = service_of(request)
    limit = _list_limit(request.query_params.get("limit"))
    after = request.query_params.get("after")
    sessions = await service.run(_listed, service, tenant_of(request))
    page = [s for s in sessions if after is None or s.session_id > after][:limit + 1]
    has_more = len(page) > limit
    page = page[:limit]
    return JSONResponse({"object": "list", "data": [_summary(s.session_id, s.backend) for s in page],
                         "first_id": page[0].session_id if page else None,
                         "last_id": page[-1].session_id if page else None, "has_more": has_more})


def _list_limit(text: str | None) -> int:
    if text is None:
        return DEFAULT_LIST_LIMIT
    try:
        limit = int(text)
    except ValueError:
        limit = 0
    if not 1 <= limit <= MAX_LIST_LIMIT:
        raise bad_request(f"limit must be an integer in 1..{MAX_LIST_LIMIT}, got {text!r}", param="limit")
    return limit


def _listed(service: Service, tenant: str | None) -> list[Session]:
    sessions = service.manager.sessions()
    if not service.fenced:
        return sessions
    refs = []
    for name in sorted({s.backend for s in sessions}):
        with contextlib.suppress(Exception):  # a backend lost: its sessions' tenants are unknown, not listed
            refs.append(service.manager.backend(name).stats_ref())
    owning: dict[str, str | None] = {}
    for ref in refs:  # sent together, read one by one
        with contextlib.suppress(Exception):  # down or restarting: as above
            owning.update((sid, row.get("tenant"))
                          for sid, row in ray.get(ref, timeout=LIST_TIMEOUT_S)["sessions"].items())
    return [s for s in sessions if s.session_id in owning and may_use(owning[s.session_id], tenant)]


@router.get("/v1/sessions/{session_id}")
@answers_errors
async def session_stats(request: Request, session_id: str) -> Response:
    service = service_of(request)
    return JSONResponse(await service.run(_read, service, session_id, tenant_of(request), lambda session: {
        **_summary(session_id, session.backend), **session.stats(), "http": service.state.session_counters(session_id)}))


@router.get("/v1/sessions/{session_id}/tokens")
@answers_errors
async def session_tokens(request: Request, session_id: str) -> Response:
    service = service_of(request)
    return JSONResponse(await service.run(_read, service, session_id, tenant_of(request), lambda session: {
        "id": session_id, "object": "session.tokens", "tokens": session.tokens(), "text": session.text()}))


def _read(service: Service, session_id: str, tenant: str | None,
          view: Callable[[Session], dict[str, Any]]) -> dict[str, Any]:
    validate_session_id(session_id)
    return view(service.session(session_id, tenant))


@router.delete("/v1/sessions/{session_id}")
@answers_errors
async def delete_session(request: Request, session_id: str) -> Response:
    service = service_of(request)
    tenant = tenant_of(request)

    def delete() -> None:
        validate_session_id(session_id)
        service.session(session_id, tenant).close()
        service.state.forget_session(session_id)

    await service.run(delete)
    return JSONResponse({"id": session_id, "object": "session.deleted", "deleted": True})


def _held(service: Service, session_id: str, tenant: str | None, action: Any) -> Any:
    stack, owner = service.lease(session_id)
    with stack:
        return action(service.session(session_id, tenant, owner))


@router.post("/v1/sessions/{session_id}/{action}")
@answers_errors
async def session_action(request: Request, session_id: str, action: str) -> Response:
    service = service_of(request)
    tenant = tenant_of(request)
    raw = await request.body()
    if action == "suspend":
        await service.run(_held, service, session_id, tenant, lambda s: s.suspend())
        return JSONResponse({"id": session_id, "object": "session", "state": "suspended"})
    if action == "resume":
        recomputed = await service.run(_held, service, session_id, tenant, lambda s: s.resume())
        return JSONResponse({"id": session_id, "object": "session", "recomputed_tokens": recomputed})
    if action == "fork":
        fork = parse(ForkBody, raw, empty_ok=True)
        branch = await service.run(_held, service, session_id, tenant,
                                   lambda s: _fork(service, s, fork.new_id, tenant))
        return JSONResponse(_summary(branch.session_id, branch.backend, forked_from=session_id))
    if action == "rollback":
        rollback = parse(RollbackBody, raw, empty_ok=True)
        length = await service.run(_held, service, session_id, tenant, lambda s: s.rollback(rollback.count))
        return JSONResponse({"id": session_id, "object": "session", "token_count": length})
    if action == "export":
        data = await service.run(_held, service, session_id, tenant,
                                 lambda s: service.manager.backend(s.backend).export(s.session_id))
        return Response(data, media_type="application/octet-stream",
                        headers={"Content-Disposition": f'attachment; filename="{session_id}.kvsession"'})
    if action == "restore":
        return JSONResponse(await service.run(_restore, service, session_id, tenant, raw))
    raise bad_request(f"unknown session action {action!r}; the actions are suspend, resume, fork, rollback, "
                      "export, restore", param="action")


def _fork(service: Service, session: Session, new_id: str | None, tenant: str | None) -> Session:
    branch = session.fork(new_id)  # of the same policy, so of the same tenant
    service.claim(branch.session_id, tenant)
    return branch


def _restore(service: Service, session_id: str, tenant: str | None, data: bytes) -> dict[str, Any]:
    validate_session_id(session_id)
    if not data:
        raise bad_request("the body must be a session file's bytes (what /export answered)")
    if len(data) > MAX_SESSION_FILE:
        raise bad_request(f"a session file of {len(data)} bytes is over the {MAX_SESSION_FILE} bytes accepted")
    if service.fenced:
        try:
            owning = peek_session(data)[1].get("tenant")
        except Exception:
            owning = tenant  # not a session file: the restore below says what is wrong with it
        if not may_use(owning, tenant):
            raise bad_request("this session file was exported from a session of another tenant than this API "
                              "key's; restore it with a key of that tenant")
    stack, _ = service.lease(session_id)
    with stack, tempfile.TemporaryDirectory(prefix="kvres-restore-") as folder:
        path = os.path.join(folder, "session.kvsession")
        with open(path, "wb") as f:
            f.write(data)
        session = service.manager.restore(path, session_id=session_id)
        service.claim(session.session_id, tenant)
    with contextlib.suppress(Exception):
        service.state.forget_session(session_id)  # counters of an older session of this id
    return _summary(session.session_id, session.backend)
