"""Backends lost with their node: their sessions move to a live backend of the same model.

Primitives:
- ``Failover(manager)``, a driver's view of lost backends:
  - ``lost(name) -> bool``: backend ``name`` is pinned (``BackendConfig.node_id``) to a node Ray
    reports dead (asked of the GCS at most every 0.5 s), or was found so before.
  - ``check(name, fresh=False)``: ``NodeLostError`` naming the backend and its node when
    ``lost(name)``.
  - ``home_of(session_id, lost) -> str``: where a session of the lost backend lives now: the
    backend the planner's directory names when it moved already, else one the planner chooses
    among the live backends of the same model (``PlannerClient.rehome``), which resumes it from
    its journal record (refs to blocks on the dead node count as gone: recomputed from the log).
  - ``stand_in(lost) -> str``: a live backend of the same model, for calls that name no session
    (``tokenize``, ``detokenize``).
  - ``record_of(session_id, lost) -> SessionRecord``: a session's journal record, for a
    migration away from a lost backend.
  - ``status_row(name) -> dict | None``: the row ``status()`` shows for a lost backend.
  - ``client(name)``: the manager's client of backend ``name`` (``backend_client.Routes``).
- ``seeds(config) -> list[LoadReport]``: the configuration's backends as the planner's seeds.

The rule: a backend pinned by ``node_id`` is not re-created when its node dies (the pin says where
it must run): its sessions move. An unpinned backend is re-created by Ray on a live node
(``max_restarts=-1``), and its sessions stay with it (rebuilt from their journal records).
"""

from __future__ import annotations

import logging
from typing import Any, Protocol

from kvres.actors.backend_setup.engine_registry import engine_spec
from kvres.actors.default_model import default_model_path, model_key
from kvres.actors.host.journal import SessionRecord
from kvres.actors.ray_actors.nodes import node_dead
from kvres.actors.ray_actors.ray_journal import RayJournal
from kvres.policy import UnknownSessionError
from kvres.policy.errors import NodeLostError, SessionExistsError
from kvres.policy.placement import LoadReport, PlacementError

from .kvres_config import BackendConfig, KvresConfig
from .planner_client import PlannerClient

log = logging.getLogger("kvres.cluster")


class _Manager(Protocol):
    namespace: str
    config: KvresConfig

    @property
    def planner_client(self) -> PlannerClient: ...

    def backend(self, name: str) -> Any: ...


def seeds(config: KvresConfig) -> list[LoadReport]:
    return [
        LoadReport(b.name, b.kv_budget_tokens, n_seq_max=b.n_seq_max, engine=b.engine,
                   engine_evicts=engine_spec(b.engine).engine_evicts,
                   model=model_key(b.model_path or default_model_path()), node=b.node_id or "")
        for b in config.backends
    ]


class Failover:
    def __init__(self, manager: _Manager) -> None:
        self._manager = manager
        self._lost: dict[str, str] = {}  # backend -> its dead node

    def _config(self, name: str) -> BackendConfig | None:
        return next((b for b in self._manager.config.backends if b.name == name), None)

    def lost(self, name: str, fresh: bool = False) -> bool:
        """``fresh``: ask the GCS now (after an error that may mean the node died)."""
        if name in self._lost:
            return True
        cfg = self._config(name)
        if cfg is None or not cfg.node_id or not node_dead(cfg.node_id, fresh):
            return False
        self._lost[name] = cfg.node_id
        log.warning("backend %r was pinned to node %s, which died: its sessions move to live backends of "
                    "its model", name, cfg.node_id)
        return True

    def check(self, name: str, fresh: bool = False) -> None:
        if self.lost(name, fresh):
            raise NodeLostError(f"backend {name!r} is lost with node {self._lost[name]} (dead); it was pinned "
                                "there (node_id) and is not re-created elsewhere")

    def status_row(self, name: str) -> dict[str, Any] | None:
        if not self.lost(name):
            return None
        return {"backend": name, "node_id": self._lost[name], "error": f"node {self._lost[name]} dead: backend lost"}

    def client(self, name: str) -> Any:
        return self._manager.backend(name)

    def _model(self, lost: str) -> str | None:
        cfg = self._config(lost)
        return None if cfg is None else model_key(cfg.model_path or default_model_path())

    def record_of(self, session_id: str, lost: str) -> SessionRecord:
        record = RayJournal(self._manager.namespace).load(session_id)
        if record is None:
            raise UnknownSessionError(session_id, f"its backend {lost!r} was lost with its node and the journal "
                                                  "holds no record of it")
        return record

    def home_of(self, session_id: str, lost: str) -> str:
        planner = self._manager.planner_client
        where = planner.where(session_id)
        if where is None:
            raise UnknownSessionError(session_id)
        if where != lost:
            return where  # moved already (by another call, or another driver)
        record = self.record_of(session_id, lost)
        residency = record.policy.residency
        try:
            target = planner.rehome(session_id, lost, self._model(lost), residency.engine_need,
                                    residency.enforced_budget_tokens or 0, seeds(self._manager.config))
        except PlacementError as exc:
            raise NodeLostError(f"backend {lost!r} is lost with node {self._lost.get(lost, '?')} (dead) and no live "
                                f"backend can take session {session_id!r}: {exc}") from None
        try:
            self._manager.backend(target).resume(session_id, record, retry_ok=(SessionExistsError,))
        except SessionExistsError:
            return target  # another call of this session moved it there first
        except BaseException:
            planner.register(session_id, lost)  # not moved: the next call tries again
            raise
        log.warning("session %r: backend %r was lost with node %s; resumed on %r from its journal record "
                    "(%d tokens)", session_id, lost, self._lost.get(lost, "?"), target, len(record.token_log))
        return target

    def stand_in(self, lost: str) -> str:
        """A live backend of the same model (the planner's load view has dropped the lost one)."""
        model = self._model(lost)
        view = self._manager.planner_client.load()["backends"]
        for row in sorted(view, key=lambda r: -int(r.get("free_tokens", 0))):
            name = str(row["backend"])
            if name != lost and not self.lost(name) and (model is None or row.get("model") == model):
                return name
        raise NodeLostError(f"backend {lost!r} is lost with node {self._lost.get(lost, '?')} (dead) and no live "
                            f"backend serves its model {model!r}")
