"""How long a session the HTTP front opens lives: parked when idle, closed when expired.

Primitives:
- ``SessionLifetime(idle_s=DEFAULT_IDLE_S, ttl_s=DEFAULT_TTL_S)``: ``idle_s``: the session is
  suspended (its KV to the cold store, its slot freed) after that many seconds without a call;
  ``ttl_s``: it is closed (its tokens and blocks deleted) after that many seconds without a call;
  None: never (``SessionPolicy.idle_suspend_s`` and ``ttl_s``); ``policy_fields()``: those two
  fields as a dict; ``describe()``: one line for ``kvres serve``'s start.
- ``lifetime_of(defaults, headers) -> SessionLifetime``: the defaults, with what a request asks
  through ``X-Session-Idle`` / ``X-Session-TTL`` (seconds, in (0, ``MAX_LIFETIME_S``]); a bad value
  is a 400 naming the header, the value and the limit.
- ``seconds_option(text) -> float | None``: a ``--session-idle`` / ``--session-ttl`` value (``0``:
  never).

The backend keeps the clocks (``kvres.actors.host.retention``): a call resets them, a session
with a call running is never touched, a suspended session is resumed by its next turn. The values
are fixed when the session opens: a header counts on the request that opens the session (a chat's
first turn under its ``X-Session-Id``, a Responses chain's first response); a fork keeps its
source's.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from .http_errors import bad_request

DEFAULT_IDLE_S = 300.0  # 5 minutes without a call: parked in the cold store, its slot freed
DEFAULT_TTL_S = 3600.0  # an hour without a call: closed
MAX_LIFETIME_S = 30 * 24 * 3600.0  # the most a request may ask for, either clock
IDLE_HEADER = "x-session-idle"
TTL_HEADER = "x-session-ttl"


@dataclass(frozen=True)
class SessionLifetime:
    idle_s: float | None = DEFAULT_IDLE_S
    ttl_s: float | None = DEFAULT_TTL_S

    def __post_init__(self) -> None:
        for name, value in (("idle_s", self.idle_s), ("ttl_s", self.ttl_s)):
            if value is not None and not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be a positive number of seconds or None (never), got {value!r}")

    def policy_fields(self) -> dict[str, float | None]:
        return {"idle_suspend_s": self.idle_s, "ttl_s": self.ttl_s}

    def describe(self) -> str:
        idle = "never parked" if self.idle_s is None else f"parked after {_seconds(self.idle_s)} s without a call"
        ttl = "never closed" if self.ttl_s is None else f"closed after {_seconds(self.ttl_s)} s without one"
        return (f"sessions {idle}, {ttl} (--session-idle, --session-ttl; per request: X-Session-Idle, "
                "X-Session-TTL)")


def _seconds(value: float) -> str:
    return str(int(value)) if value == int(value) else str(value)


def seconds_option(text: str) -> float | None:
    """A command-line value in seconds; ``0`` turns the clock off."""
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"expected a number of seconds (0: never), got {text!r}") from None
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"expected a number of seconds >= 0 (0: never), got {text!r}")
    return None if value == 0 else value


def _header_seconds(headers: Mapping[str, str], name: str, shown: str) -> float | None:
    text = headers.get(name)
    if text is None:
        return None
    try:
        value = float(text.strip())
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and 0 < value <= MAX_LIFETIME_S):
        raise bad_request(f"{shown} must be a number of seconds in (0, {int(MAX_LIFETIME_S)}], got {text!r}",
                          param=shown, code="invalid_value")
    return value


def lifetime_of(defaults: SessionLifetime, headers: Mapping[str, str]) -> SessionLifetime:
    idle = _header_seconds(headers, IDLE_HEADER, "X-Session-Idle")
    ttl = _header_seconds(headers, TTL_HEADER, "X-Session-TTL")
    return SessionLifetime(idle_s=defaults.idle_s if idle is None else idle,
                           ttl_s=defaults.ttl_s if ttl is None else ttl)
