"""The actors a manager starts and stops: how their failures read, how their blocks go.

Primitives:
- ``ConnectError``: a kvres actor could not start (its own error is quoted); nothing was left running.
- ``start_error(kind, name, exc) -> ConnectError``: the actor's own error (the last line Ray quotes
  of its creation task) as a kvres error.
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

from .remote_calls import answer

log = logging.getLogger("kvres.cluster")


class ConnectError(KvresError, RuntimeError):
    """A kvres actor could not start (its own error is quoted); nothing was left running."""


_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def start_error(kind: str, name: str, exc: BaseException) -> ConnectError:
    """The actor's own error (the last line Ray quotes of its creation task) as a kvres error."""
    text = _ANSI.sub("", str(getattr(exc, "error_msg", None) or exc)).strip()
    cause = text.splitlines()[-1].strip() if text else type(exc).__name__
    return ConnectError(
        f"{kind} {name!r} could not start: {cause} (the actors this connect() created are stopped)"
    )


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
