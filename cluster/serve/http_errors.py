"""kvres's errors as HTTP answers with an OpenAI-style error body.

Primitives:
- ``ApiError(status, message, type=..., param=None, code=None, headers=None)``: an answer to send
  as it is; ``body()`` is ``{"error": {"message", "type", "param", "code"}}``; ``headers``: what
  goes with it (a 429's ``Retry-After``).
- ``SessionLockedError``: another request is running on the session (``409`` ``session_busy``, never
  queued, with ``Retry-After: BUSY_RETRY_AFTER_S``).
- ``api_error(exc) -> ApiError``: the status for any exception: bad input (pydantic's
  ``ValidationError`` naming the field, kvres's typed refusals, ``ValueError`` / ``TypeError``)
  400 (a prompt past what its session can hold: ``context_length_exceeded``), an unknown session or
  response 404, a session busy or already open 409, no backend that
  can make room for it 429 (with ``Retry-After``, in whole seconds, where the backend gave a hint:
  a call that waited for room past ``BackendConfig.max_room_wait_s``), an actor lost or restarting
  503; anything else is a server fault, 500.
"""

from __future__ import annotations

import math
from typing import Any

from pydantic import ValidationError
from ray.exceptions import GetTimeoutError, RayActorError

from kvres.actors.host.refusals import (
    BackendFullError,
    OtherTenantsSessionError,
    SessionBusyError,
    SessionHeldError,
    TenantQuotaError,
)
from kvres.actors.host.scheduler import LoopStoppedError
from kvres.actors.tools.errors import ToolError
from kvres.coldstore.errors import (
    BlockCorruptError,
    ColdStoreError,
    DiskReadError,
    DiskWriteError,
    InvalidSessionIdError,
    StoreLockedError,
)
from kvres.policy import ContextLengthError, KvresError, SessionExistsError, UnknownSessionError
from kvres.policy.errors import ActorLostError, BlockMismatchError, CapabilityError, ModelLoadError
from kvres.policy.placement import PlacementError

from ..session import ConnectError

BUSY_RETRY_AFTER_S = 1  # a session busy with another request's turn: try again after this long


class ApiError(KvresError):
    def __init__(self, status: int, message: str, type: str = "invalid_request_error",  # noqa: A002 (OpenAI's name)
                 param: str | None = None, code: str | None = None, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


class SessionLockedError(KvresError):
    """Another request holds the session; this one is refused (409), not queued."""


def bad_request(message: str, param: str | None = None, code: str | None = None) -> ApiError:
    return ApiError(400, message, param=param, code=code)


def not_found(message: str, param: str | None = None, code: str = "not_found") -> ApiError:
    return ApiError(404, message, param=param, code=code)


def _validation(exc: ValidationError, prefix: str = "") -> ApiError:
    errors = exc.errors(include_url=False)
    first = errors[0] if errors else {"loc": (), "msg": str(exc)}
    param = prefix + ".".join(str(p) for p in first["loc"]) if first["loc"] else (prefix.rstrip(".") or None)
    parts = []
    for e in errors[:5]:
        where = prefix + ".".join(str(p) for p in e["loc"])
        got = "" if e.get("type") == "missing" else f" (got {_short(e.get('input'))})"
        parts.append(f"{where or 'body'}: {e['msg']}{got}")
    more = f" (and {len(errors) - 5} more)" if len(errors) > 5 else ""
    return ApiError(400, "; ".join(parts) + more, param=param, code="invalid_value")


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _retry_after(exc: BaseException) -> dict[str, str]:
    """``Retry-After`` in whole seconds (HTTP's delay-seconds), where the refusal gave a hint."""
    seconds = getattr(exc, "retry_after_s", None)
    return {} if seconds is None else {"Retry-After": str(max(1, math.ceil(seconds)))}


def api_error(exc: BaseException, prefix: str = "") -> ApiError:
    """``prefix``: where the validated object sits in the request (e.g. ``"sampling."``)."""
    if isinstance(exc, ApiError):
        return exc
    if isinstance(exc, ValidationError):
        return _validation(exc, prefix)
    message = str(exc) or type(exc).__name__
    if isinstance(exc, (UnknownSessionError, OtherTenantsSessionError)):
        return ApiError(404, message, param="session_id", code="session_not_found")
    if isinstance(exc, (SessionExistsError,)):
        return ApiError(409, message, param="session_id", code="session_exists")
    if isinstance(exc, (SessionBusyError, SessionLockedError, SessionHeldError)):
        return ApiError(409, message, param="session_id", code="session_busy",
                        headers={"Retry-After": str(BUSY_RETRY_AFTER_S)})
    if isinstance(exc, (BackendFullError, PlacementError)):
        code = "tenant_quota" if isinstance(exc, TenantQuotaError) else "backend_full"
        return ApiError(429, message, type="rate_limit_error", code=code, headers=_retry_after(exc))
    if isinstance(exc, ContextLengthError):
        return ApiError(400, message, param="messages", code="context_length_exceeded")
    if isinstance(exc, InvalidSessionIdError):
        return ApiError(400, message, param="session_id", code="invalid_session_id")
    if isinstance(exc, (ActorLostError, RayActorError, GetTimeoutError, ModelLoadError, ConnectError,
                        LoopStoppedError, DiskWriteError, DiskReadError, StoreLockedError)):
        return ApiError(503, f"kvres is unavailable for now ({type(exc).__name__}: {message}); retry later",
                        type="server_error", code="unavailable")
    if isinstance(exc, ToolError):
        return ApiError(400, message, param=exc.field, code="invalid_value")
    if isinstance(exc, CapabilityError):
        return ApiError(400, message, code="unsupported")
    if isinstance(exc, (BlockCorruptError, BlockMismatchError)):
        return ApiError(400, message, code="invalid_session_file")
    if isinstance(exc, (ColdStoreError,)) and not isinstance(exc, ValueError):
        return ApiError(503, message, type="server_error", code="unavailable")
    if isinstance(exc, (KvresError, ValueError, TypeError)):
        return ApiError(400, message, code="invalid_value")
    return ApiError(500, f"internal error ({type(exc).__name__}); the server log has the details",
                    type="server_error", code="internal_error")
