"""``/v1/sessions``: kvres's sessions over HTTP (kvres's own API, not OpenAI's).

Primitives:
- ``router``: ``GET /v1/sessions`` (every open session and its backend), ``GET
  /v1/sessions/{id}`` (the backend's stats: state, token count, resident ranges, cold blocks,
  counters; and ``http``: the turns, prefilled, cached and completion tokens the HTTP front
  counted for it), ``GET /v1/sessions/{id}/tokens`` (its token log, and as text with the control
  tokens), ``DELETE /v1/sessions/{id}`` (closed; the stored responses that named it are
  forgotten), ``POST /v1/sessions/{id}/suspend``, ``/resume`` (answers the tokens recomputed),
  ``/fork`` (body ``{"new_id": ...}``, optional), ``/rollback`` (body ``{"count": n}``), ``/export``
  (the session file's bytes, ``application/octet-stream``, authenticated with the cluster's block
  secret) and ``/restore`` (those bytes as the body: a session of this id on this cluster).

Every call but ``GET`` and ``DELETE`` holds the session's lease (409 while a turn runs on it);
``DELETE`` closes the session even then (its running call ends).
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Callable
from typing import Any

from fastapi import APIRouter
from pydantic import BaseModel, ConfigDict, StrictInt, StrictStr
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from kvres.coldstore import validate_session_id

from ..session_handle import Session
from .errors import bad_request
from .http_glue import answers_errors, parse, service_of
from .service import Service

router = APIRouter()
MAX_SESSION_FILE = 1 << 30


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
    sessions = await service.run(service.manager.sessions)
    return JSONResponse({"object": "list", "data": [_summary(s.session_id, s.backend) for s in sessions]})


@router.get("/v1/sessions/{session_id}")
@answers_errors
async def session_stats(request: Request, session_id: str) -> Response:
    service = service_of(request)
    return JSONResponse(await service.run(_read, service, session_id, lambda session: {
        **_summary(session_id, session.backend), **session.stats(), "http": service.state.session_counters(session_id)}))


@router.get("/v1/sessions/{session_id}/tokens")
@answers_errors
async def session_tokens(request: Request, session_id: str) -> Response:
    service = service_of(request)
    return JSONResponse(await service.run(_read, service, session_id, lambda session: {
        "id": session_id, "object": "session.tokens", "tokens": session.tokens(), "text": session.text()}))


def _read(service: Service, session_id: str, view: Callable[[Session], dict[str, Any]]) -> dict[str, Any]:
    validate_session_id(session_id)
    return view(service.manager.session(session_id))


@router.delete("/v1/sessions/{session_id}")
@answers_errors
async def delete_session(request: Request, session_id: str) -> Response:
    service = service_of(request)

    def delete() -> None:
        validate_session_id(session_id)
        service.manager.session(session_id).close()
        service.state.forget_session(session_id)

    await service.run(delete)
    return JSONResponse({"id": session_id, "object": "session.deleted", "deleted": True})


def _held(service: Service, session_id: str, action: Any) -> Any:
    with service.lease(session_id):
        return action(service.manager.session(session_id))


@router.post("/v1/sessions/{session_id}/{action}")
@answers_errors
async def session_action(request: Request, session_id: str, action: str) -> Response:
    service = service_of(request)
    raw = await request.body()
    if action == "suspend":
        await service.run(_held, service, session_id, lambda s: s.suspend())
        return JSONResponse({"id": session_id, "object": "session", "state": "suspended"})
    if action == "resume":
        recomputed = await service.run(_held, service, session_id, lambda s: s.resume())
        return JSONResponse({"id": session_id, "object": "session", "recomputed_tokens": recomputed})
    if action == "fork":
        fork = parse(ForkBody, raw, empty_ok=True)
        branch = await service.run(_held, service, session_id, lambda s: s.fork(fork.new_id))
        return JSONResponse(_summary(branch.session_id, branch.backend, forked_from=session_id))
    if action == "rollback":
        rollback = parse(RollbackBody, raw, empty_ok=True)
        length = await service.run(_held, service, session_id, lambda s: s.rollback(rollback.count))
        return JSONResponse({"id": session_id, "object": "session", "token_count": length})
    if action == "export":
        data = await service.run(_held, service, session_id,
                                 lambda s: service.manager.backend(s.backend).export(s.session_id))
        return Response(data, media_type="application/octet-stream",
                        headers={"Content-Disposition": f'attachment; filename="{session_id}.kvsession"'})
    if action == "restore":
        return JSONResponse(await service.run(_restore, service, session_id, raw))
    raise bad_request(f"unknown session action {action!r}; the actions are suspend, resume, fork, rollback, "
                      "export, restore", param="action")


def _restore(service: Service, session_id: str, data: bytes) -> dict[str, Any]:
    validate_session_id(session_id)
    if not data:
        raise bad_request("the body must be a session file's bytes (what /export answered)")
    if len(data) > MAX_SESSION_FILE:
        raise bad_request(f"a session file of {len(data)} bytes is over the {MAX_SESSION_FILE} bytes accepted")
    with service.lease(session_id), tempfile.TemporaryDirectory(prefix="kvres-restore-") as folder:
        path = os.path.join(folder, "session.kvsession")
        with open(path, "wb") as f:
            f.write(data)
        session = service.manager.restore(path, session_id=session_id)
    with contextlib.suppress(Exception):
        service.state.forget_session(session_id)  # counters of an older session of this id
    return _summary(session.session_id, session.backend)
