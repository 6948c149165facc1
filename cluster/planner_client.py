"""A driver's typed client of the planner actor: one method per actor method it uses.

Primitives:
- ``PlannerClient(handle, revive)``: ``handle()`` is the planner's handle now, ``revive()`` waits
  until it answers again (or raises ``PlannerLostError``). ``place`` (the backend chosen and
  registered, or None when a repeat after a death finds the first attempt had placed it),
  ``rehome`` (a live backend for a session whose backend died with its node), ``lost`` (backends
  dropped for a dead node), ``register``, ``forget``, ``where``, ``directory``, ``load``; ``directory_ref`` sends without
  waiting (what a revive pings).

Each call is one Ray call; one that meets the planner's death waits for it to come back and is sent
once more (``remote_calls.call``); errors it raises arrive as their kvres types.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from ray import ObjectRef

from kvres.policy import SessionExistsError
from kvres.policy.errors import PlannerLostError
from kvres.policy.placement import LoadReport, PlacementPolicy
from kvres.policy.residency import EngineNeed

from .remote_calls import call


class PlannerClient:
    def __init__(self, handle: Callable[[], Any], revive: Callable[[], None]) -> None:
        self._handle = handle
        self._revive = revive

    def _call(self, submit: Callable[[Any], Any], retry_ok: tuple[type[BaseException], ...] = ()) -> Any:
        return call(lambda: submit(self._handle()), self._revive, PlannerLostError, "the planner", retry_ok=retry_ok)

    def place(self, session_id: str, model: str | None, placement: PlacementPolicy, need: EngineNeed,
              demand_tokens: int, seeds: Sequence[LoadReport]) -> str | None:
        placed = self._call(lambda h: h.place.remote(session_id, model, placement, need, demand_tokens, list(seeds)),
                            retry_ok=(SessionExistsError,))
        return None if placed is None else str(placed)

    def rehome(self, session_id: str, lost: str, model: str | None, need: EngineNeed, demand_tokens: int,
               seeds: Sequence[LoadReport]) -> str:
        return str(self._call(lambda h: h.rehome.remote(session_id, lost, model, need, demand_tokens, list(seeds))))

    def lost(self) -> dict[str, str]:
        return dict(self._call(lambda h: h.lost.remote()))

    def register(self, session_id: str, backend: str) -> None:
        self._call(lambda h: h.register.remote(session_id, backend))

    def forget(self, session_id: str) -> None:
        self._call(lambda h: h.forget.remote(session_id))

    def where(self, session_id: str) -> str | None:
        backend = self._call(lambda h: h.where.remote(session_id))
        return None if backend is None else str(backend)

    def directory(self) -> dict[str, str]:
        return dict(self._call(lambda h: h.directory.remote()))

    def load(self) -> dict[str, Any]:
        return dict(self._call(lambda h: h.load.remote()))

    def directory_ref(self) -> ObjectRef[dict[str, str]]:
        ref: ObjectRef[dict[str, str]] = self._handle().directory.remote()
        return ref
