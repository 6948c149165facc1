"""The actors a manager starts and stops: how their failures read, how their blocks go.

Primitives:
- ``ConnectError``: a kvres actor could not start (its own error is quoted); nothing was left running.
- ``start_error(kind, name, exc, failure=None, undone=CONNECT_UNDONE) -> ConnectError``: the actor's
  own error (a backend's ``BackendStartError`` record where it has one: the engine's words, else
  the last line Ray quotes of its creation task) as a kvres error; ``undone`` says what became of it.
- ``destroy_stores(stores, timeout_s=60.0)``: every block of each store dropped and its folder
  removed; a failure is logged, not raised.
- ``actor_exists(name, namespace) -> bool``.
- ``status_row(ref, **names) -> dict``: an actor's stats, or ``{**names, "error": ...}`` when it is
  down.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from typing import Any

import ray
from ray.exceptions import ActorUnschedulableError, RayActorError

from kvres.policy import KvresError
from kvres.policy.errors import BackendStartError

from .remote_calls import answer

log = logging.getLogger("kvres.cluster")


class ConnectError(KvresError, RuntimeError):
    """A kvres actor could not start (its own error is quoted); nothing was left running."""


_ANSI = re.compile(r"\x1b\[[0-9;]*m")


CONNECT_UNDONE = "the actors this connect() created are stopped"


def start_error(kind: str, name: str, exc: BaseException, failure: BackendStartError | None = None,
                undone: str = CONNECT_UNDONE) -> ConnectError:
    """The actor's own error as a kvres error: the reason a backend's start record gives (with its
    attempts), else the last line Ray quotes of the creation task."""
    if failure is not None:
        tries = f"{failure.attempts} attempt{'' if failure.attempts == 1 else 's'}"
        return ConnectError(f"{kind} {name!r} could not start: {failure.reason} ({tries}; {undone})")
    text = _ANSI.sub("", str(getattr(exc, "error_msg", None) or exc)).strip()
    cause = text.splitlines()[-1].strip() if text else type(exc).__name__
    return ConnectError(f"{kind} {name!r} could not start: {cause} ({undone})")


def destroy_stores(stores: Sequence[Any], timeout_s: float = 60.0) -> None:
    """Drop every block of each store and remove its folder; a failure is logged, not raised, so
    a shutdown always goes on to stop every actor."""
    refs = [store.destroy.remote() for store in stores]
    if not refs:
        return
    ready, pending = ray.wait(refs, num_returns=len(refs), timeout=timeout_s)
    for ref in ready:
        try:
            ray.get(ref)
        except Exception as exc:  # a store already dead has nothing to remove; others: say so
            log.warning("removing a cold store's blocks failed: %s", exc)
    if pending:
        log.warning("%d cold store(s) did not remove their blocks within %.0f s", len(pending), timeout_s)


def actor_exists(name: str, namespace: str) -> bool:
    try:
        ray.get_actor(name, namespace=namespace)
    except ValueError:
        return False
    return True


def status_row(ref: Any, **names: str) -> dict[str, Any]:
    try:
        return dict(answer(ref))
    except (RayActorError, ActorUnschedulableError) as exc:
        return {**names, "error": f"{type(exc).__name__}: actor down (restarting)"}
