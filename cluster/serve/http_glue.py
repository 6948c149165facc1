"""What every route shares: the service, errors as answers, server-sent events, auth and metrics.

Primitives:
- ``service_of(request) -> Service``: the replica's service (``app.state.service``).
- ``parse(model_type, body: bytes, empty_ok=False) -> model``: JSON, then the pydantic model; every
  problem a 400 naming it (an empty body reads as ``{}`` where ``empty_ok``).
- ``await read_request(request, model_type) -> (service, request model, served model, backend)``:
  what a generating route starts with: the body parsed and its ``model`` resolved.
- ``error_response(err: ApiError) -> JSONResponse``; ``answers_errors(route)``: a decorator that
  turns any exception of a route into its HTTP answer (``api_error``); a 500 is logged with its
  traceback.
- ``sse(data, event=None) -> str``: one server-sent event; ``SSE_DONE`` ends a chat stream.
- ``route_label(path) -> str``: the route a path belongs to (``/v1/sessions/{id}``, ...), the
  metrics' label (a bounded set, whatever the ids).
- ``note(request, **fields)``: what a route learnt about its turn (ttft_s, gaps, prompt_tokens,
  cached_tokens, completion_tokens, session_id) for the metrics.
- ``FrontDoor(app)``: an ASGI middleware: the API key checked (``/health`` is open; a refused request
  is a 401 with an OpenAI-style body), then each request counted when its last byte is sent or its
  client left (``ServeState.enter`` / ``record``); every answer names the replica that gave it
  (``X-Kvres-Replica``).
"""

from __future__ import annotations

import functools
import json
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

from pydantic import BaseModel, ValidationError
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .http_errors import ApiError, api_error, bad_request
from .metrics import RequestSample

if TYPE_CHECKING:
    from .catalog import ServedModel
    from .service import Service

log = logging.getLogger("kvres.serve")
SSE_DONE = "data: [DONE]\n\n"
OPEN_PATHS = ("/health",)


M = TypeVar("M", bound=BaseModel)


def service_of(request: Request) -> Service:
    service: Service = request.app.state.service
    return service


def parse(model_type: type[M], body: bytes, empty_ok: bool = False) -> M:
    if not body.strip():
        if not empty_ok:
            raise bad_request("the request body is empty; send a JSON object")
        body = b"{}"
    try:
        raw = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise bad_request(f"the request body is not valid JSON: {exc}") from None
    if not isinstance(raw, dict):
        raise bad_request(f"the request body must be a JSON object, got a JSON {type(raw).__name__}")
    try:
        return model_type.model_validate(raw)
    except ValidationError as exc:
        raise api_error(exc) from None


async def read_request(request: Request, model_type: type[M]) -> tuple[Service, M, ServedModel, str | None]:
    service = service_of(request)
    req = parse(model_type, await request.body())
    model, backend = service.catalog.resolve(getattr(req, "model", None))
    return service, req, model, backend


def error_response(err: ApiError, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(err.body(), status_code=err.status, headers={**err.headers, **(headers or {})})


def answers_errors(route: Callable[..., Awaitable[Response]]) -> Callable[..., Awaitable[Response]]:
    @functools.wraps(route)
    async def wrapped(*args: Any, **kwargs: Any) -> Response:
        try:
            return await route(*args, **kwargs)
        except Exception as exc:
            err = api_error(exc)
            if err.status >= 500 and err.code == "internal_error":
                log.exception("kvres serve: %s failed", route.__name__)
            return error_response(err)
    return wrapped


def sse(data: Any, event: str | None = None) -> str:
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {json.dumps(data, ensure_ascii=False)}\n\n"


def route_label(path: str) -> str:
    parts = [p for p in path.split("/") if p]
    if not parts:
        return "/"
    if parts[0] in ("health", "metrics") and len(parts) == 1:
        return f"/{parts[0]}"
    if parts[0] != "v1" or len(parts) < 2:
        return "other"
    head = parts[1]
    if head in ("chat", "completions", "models") or (head == "responses" and len(parts) == 2):
        return "/" + "/".join(parts[: 3 if head == "chat" else 2])
    if head == "responses":
        return "/v1/responses/{id}" + ("/input_items" if len(parts) > 3 else "")
    if head == "sessions":
        if len(parts) == 2:
            return "/v1/sessions"
        return "/v1/sessions/{id}" + (f"/{parts[3]}" if len(parts) > 3 and parts[3].isidentifier() else "")
    return "other"


def tenant_of(request: Request) -> str | None:
    """The tenant label of the API key the request came with (None: a key without one, or no keys)."""
    tenant: str | None = request.scope.get("state", {}).get("kvres_tenant")
    return tenant


def note(request: Request, **fields: Any) -> None:
    sample: dict[str, Any] | None = request.scope.get("state", {}).get("kvres_sample")
    if sample is not None:
        sample.update(fields)


def _unauthorized() -> ApiError:
    return ApiError(401, "a valid API key is required: send it as 'Authorization: Bearer <key>'",
                    code="invalid_api_key")


class FrontDoor:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        service: Service = scope["app"].state.service
        path = scope.get("path", "")
        if path not in OPEN_PATHS:
            headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
            allowed, tenant = service.keys.match(headers.get("authorization"), headers.get("x-api-key"))
            if not allowed:
                await error_response(_unauthorized(), {"WWW-Authenticate": "Bearer"})(scope, receive, send)
                return
            scope.setdefault("state", {})["kvres_tenant"] = tenant  # the sessions it opens count against it
        route = route_label(path)
        started = time.monotonic()
        sample: dict[str, Any] = {}
        scope.setdefault("state", {})["kvres_sample"] = sample
        status = [0]
        recorded = [False]

        def record(code: int) -> None:
            if recorded[0]:
                return
            recorded[0] = True
            try:
                service.state.record(RequestSample(route=route, status=code, duration_s=time.monotonic() - started,
                                                   ttft_s=sample.get("ttft_s"), gaps=sample.get("gaps"),
                                                   prompt_tokens=sample.get("prompt_tokens", 0),
                                                   cached_tokens=sample.get("cached_tokens", 0),
                                                   completion_tokens=sample.get("completion_tokens", 0),
                                                   session_id=sample.get("session_id"),
                                                   prefix_breaks=int(bool(sample.get("prefix_break")))))
            except Exception as exc:  # metrics never fail a request
                log.warning("kvres serve: recording metrics failed: %s", exc)

        async def counting_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                status[0] = int(message["status"])
                message = {**message, "headers": [*message.get("headers", []),
                                                  (b"x-kvres-replica", service.state.replica.encode())]}
            await send(message)
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                record(status[0])

        try:
            service.state.enter(route)
        except Exception as exc:
            log.warning("kvres serve: recording metrics failed: %s", exc)
        try:
            await self.app(scope, receive, counting_send)
        finally:
            record(status[0] or 499)  # 499: the client left before the answer began
