"""One configuration per cluster: what a driver passes must agree with what the cluster published.

Primitives:
- ``check_agreement(driver, published, namespace)``: the driver's ``KvresConfig`` against the one
  the namespace's actors were created with (``kvres start`` or the first driver published it).
  A backend of the same name must have the same fields, a backend the cluster lacks must be added
  explicitly (``SessionManager.add_backend``), and the cold store must be the same;
  ``ConfigConflictError`` otherwise, naming each backend and field that differs. Backends the
  driver leaves out are fine (a driver may name a subset).
- ``ConfigConflictError``: a typed ``KvresError`` / ``ValueError``.
"""

from __future__ import annotations

from typing import Any

from kvres.policy.errors import KvresError

from .kvres_config import KvresConfig


class ConfigConflictError(KvresError, ValueError):
    """A driver's configuration disagrees with the one its cluster runs."""


def _differences(mine: dict[str, Any], theirs: dict[str, Any]) -> list[str]:
    return [f"{key}={mine.get(key)!r} (the cluster's: {theirs.get(key)!r})"
            for key in sorted(set(mine) | set(theirs)) if mine.get(key) != theirs.get(key)]


def check_agreement(driver: KvresConfig, published: KvresConfig, namespace: str) -> None:
    theirs = {b.name: b for b in published.backends}
    problems: list[str] = []
    for backend in driver.backends:
        known = theirs.get(backend.name)
        if known is None:
            problems.append(f"backend {backend.name!r} is not one of the cluster's {sorted(theirs)}: add it with "
                            "manager.add_backend(...) or leave it out")
            continue
        diff = _differences(backend.model_dump(mode="json"), known.model_dump(mode="json"))
        if diff:
            problems.append(f"backend {backend.name!r} differs: {', '.join(diff)}")
    store = _differences(driver.cold_store.model_dump(mode="json"), published.cold_store.model_dump(mode="json"))
    if store:
        problems.append(f"cold_store differs: {', '.join(store)}")
    if problems:
        raise ConfigConflictError(
            f"this driver's configuration disagrees with the one namespace {namespace!r} runs with: "
            + "; ".join(problems) + ". Connect without config= to use the cluster's."
        )
