"""How a driver calls kvres's actors: their errors arrive as themselves, their deaths as kvres errors.

Primitives:
- ``answer(ref)``: ``ray.get(ref)`` (an ``in_process.Done``: its value), with an error the actor
  raised re-raised as itself (Ray wraps it in a ``RayTaskError`` that quotes the remote traceback
  inside the message).
- ``call(submit, revive, lost, who, retry=True, retry_ok=())``: ``answer(submit())``; when the
  actor died (or is restarting) during the call, ``revive()`` waits until it answers again and,
  with ``retry``, the call is sent once more (every retried call is idempotent: the ones that change
  a session carry a request id). A second death, or an actor that does not come back, raises
  ``lost`` with a message that says what happened and what to do. An error in ``retry_ok`` raised by
  the retry means the first attempt had already done the work: the call returns None.
- ``is_actor_death(exc)``: the exception says the called actor died or cannot be reached.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import ray
from ray.exceptions import GetTimeoutError, RayActorError, RayTaskError

from kvres.policy.errors import ActorLostError

from .in_process import Done

RESTART_WAIT_S = 180.0  # how long a driver waits for a dead actor to come back (model load included)


def is_actor_death(exc: BaseException) -> bool:
    return isinstance(exc, RayActorError)


def answer(ref: Any) -> Any:
    if type(ref) is Done:  # a call to a backend of this very process (in_process)
        return ref.value
    try:
        return ray.get(ref)
    except RayTaskError as exc:
        cause = exc.cause
        if isinstance(cause, BaseException) and not isinstance(cause, RayActorError):
            raise cause from None
        raise


def call(
    submit: Callable[[], Any],
    revive: Callable[[], None],
    lost: type[ActorLostError],
    who: str,
    retry: bool = True,
    retry_ok: tuple[type[BaseException], ...] = (),
) -> Any:
    try:
        return answer(submit())
    except RayActorError as exc:
        first = _reason(exc)
    revive()
    if not retry:
        raise lost(f"{who} died during the call ({first}); it has been restarted and the session's committed "
                   "state is intact: repeat the call")
    try:
        return answer(submit())
    except RayActorError as exc:
        raise lost(f"{who} died twice during one call ({first}; then {_reason(exc)}); check its logs "
                   "(`ray logs`), then repeat the call") from None
    except retry_ok:
        return None


def wait_until_answers(ping: Callable[[], Any], lost: type[ActorLostError], who: str,
                       timeout_s: float = RESTART_WAIT_S) -> None:
    """Call ``ping()`` (one Ray call returning a ref, to a handle looked up afresh by the caller)
    until it answers; ``lost`` if it has not within ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    last = "no answer"
    while True:
        try:
            ray.get(ping(), timeout=min(10.0, max(0.1, deadline - time.monotonic())))
            return
        except (RayActorError, GetTimeoutError, ValueError) as exc:  # ValueError: no actor by that name yet
            last = _reason(exc)
        if time.monotonic() >= deadline:
            raise lost(f"{who} did not come back within {timeout_s:.0f} s ({last}); check `kvres status` and "
                       "the actor's logs, then reconnect") from None
        time.sleep(0.2)


def _reason(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:200]}" if text else type(exc).__name__
