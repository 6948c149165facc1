"""What a driver holds: the session manager and its sessions.

Primitives:
- ``connect(address=None, namespace="kvres", config=None) -> SessionManager``: attach to a running
  Ray cluster (``address`` or RAY_ADDRESS) or start a local one, then find or create the named
  actors: the planner, one cold store per node, the configured backends.
- ``SessionManager``: ``open_session(model=None, policy=None, session_id=None, backend=None,
  placement=None)`` (placed by the planner from the load backends push: one Ray call whatever the
  number of backends), ``session(session_id)``, ``backends()``, ``status(detail=True)``,
  ``shutdown()``.
- ``Session``: ``append(tokens or text)``, ``generate``, ``stream``, ``suspend``, ``resume``,
  ``migrate(backend)``, ``stats()``, ``detokenize``, ``close()``.

Each call is one Ray call (generation is batched inside the backend, never one remote call per
token); errors raised by the actors arrive as their kvres types.
"""

from __future__ import annotations

import os
import re
import tempfile
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from kvres.actors.backend_actor import BackendActor, backend_actor_name
from kvres.actors.coldstore_actor import MeteredColdStoreActor
from kvres.actors.default_model import default_model_path
from kvres.actors.planner_actor import PLANNER_NAME, PlannerActor
from kvres.actors.store_ports import cold_store_name
from kvres.policy import KvresError, UnknownSessionError
from kvres.policy.placement import LoadReport, PlacementPolicy
from kvres.policy.tokens import token_ids

from .config import BackendConfig, KvresConfig, SessionPolicy


class Session:
    def __init__(self, manager: SessionManager, session_id: str, backend: str) -> None:
        self._manager = manager
        self.session_id = session_id
        self.backend = backend

    def __repr__(self) -> str:
        return f"Session({self.session_id!r} on {self.backend!r})"

    @property
    def _actor(self) -> Any:
        return self._manager.backend_handle(self.backend)

    def append(self, tokens_or_text: str | Sequence[int]) -> list[int]:
        """Append token ids, or text (tokenized by the backend's model); returns the token ids."""
        if isinstance(tokens_or_text, str):
            return list(ray.get(self._actor.append_text.remote(self.session_id, tokens_or_text)))
        tokens = token_ids(tokens_or_text)
        ray.get(self._actor.append.remote(self.session_id, tokens))
        return tokens

    def generate(self, max_tokens: int, temperature: float = 0.0, seed: int | None = None) -> list[int]:
        return list(ray.get(self._actor.generate.remote(self.session_id, max_tokens, temperature, seed)))

    def stream(self, max_tokens: int, temperature: float = 0.0, seed: int | None = None) -> Iterator[int]:
        """Tokens as they are produced (a Ray streaming generator underneath)."""
        for ref in self._actor.stream.remote(self.session_id, max_tokens, temperature, seed):
            yield int(ray.get(ref))

    def suspend(self) -> None:
        ray.get(self._actor.suspend.remote(self.session_id))

    def resume(self) -> int:
        """Bring the session back; returns how many tokens had to be recomputed."""
        return int(ray.get(self._actor.resume.remote(self.session_id)))

    def migrate(self, backend: str) -> None:
        """Move to another backend (on another node where there is one); KV travels through the
        cold store, nothing is lost if the target refuses it."""
        self._manager.migrate(self, backend)

    def stats(self) -> dict[str, Any]:
        return dict(ray.get(self._actor.session_stats.remote(self.session_id)))

    def detokenize(self, tokens: Sequence[int]) -> str:
        return str(ray.get(self._actor.detokenize.remote(list(tokens))))

    def close(self) -> None:
        ray.get(self._actor.close.remote(self.session_id))
        ray.get(self._manager.planner.forget.remote(self.session_id))


class SessionManager:
    def __init__(self, namespace: str, config: KvresConfig, started_ray: bool) -> None:
        self.namespace = namespace
        self.config = config
        self._started_ray = started_ray
        self.planner: Any = PlannerActor.options(
            name=PLANNER_NAME, namespace=namespace, get_if_exists=True, lifetime="detached", num_cpus=0,
        ).remote()
        self.cold_stores = self._ensure_cold_stores()
        self._backends: dict[str, Any] = {}
        for backend in config.backends:
            self._backends[backend.name] = self._ensure_backend(backend)
        ray.get([h.ping.remote() for h in self._backends.values()])

    # -- actors ----------------------------------------------------------------------------
    def _ensure_cold_stores(self) -> dict[str, Any]:
        stores: dict[str, Any] = {}
        cfg = self.config.cold_store
        for node in ray.nodes():  # type: ignore[no-untyped-call]
            if not node.get("Alive"):
                continue
            node_id = node["NodeID"]
            name = cold_store_name(node_id)
            folder = re.sub(r"[^A-Za-z0-9_.-]", "_", f"{self.namespace}-{name}")  # per namespace and node
            disk = cfg.disk_dir / folder if cfg.disk_dir else Path(tempfile.gettempdir()) / folder
            stores[name] = MeteredColdStoreActor.options(
                name=name, namespace=self.namespace, get_if_exists=True, lifetime="detached",
                num_cpus=0, scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False),
            ).remote(cfg.ram_budget_bytes, str(disk), cfg.disk_budget_bytes)
        ray.get([s.stats.remote() for s in stores.values()])
        return stores

    def _ensure_backend(self, cfg: BackendConfig) -> Any:
        if cfg.model_path is None:
            cfg = cfg.model_copy(update={"model_path": default_model_path()})
        options: dict[str, Any] = {
            "name": backend_actor_name(cfg.name), "namespace": self.namespace, "get_if_exists": True,
            "lifetime": "detached", "num_cpus": 0, "num_gpus": cfg.num_gpus,
        }
        if cfg.node_id:
            options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(cfg.node_id, soft=False)
        return BackendActor.options(**options).remote(cfg, self.namespace)

    def backend_handle(self, name: str) -> Any:
        try:
            return self._backends[name]
        except KeyError:
            raise KvresError(f"unknown backend {name!r}; known: {sorted(self._backends)}") from None

    def backends(self) -> list[str]:
        return list(self._backends)

    # -- sessions --------------------------------------------------------------------------
    def _place(
        self,
        model: str | os.PathLike[str] | None,
        policy: SessionPolicy,
        session_id: str,
        placement: PlacementPolicy | str | None = None,
    ) -> str:
        """One call to the planner, however many backends there are: it chooses from the load
        the backends push (``kvres.policy.placement``) and registers the session there. The
        first call also hands it this configuration's backends, so a backend that has not
        reported yet counts as empty."""
        seeds: list[LoadReport] = []
        if not getattr(self, "_placement_seeded", False):
            seeds = [
                LoadReport(b.name, b.kv_budget_tokens, n_seq_max=b.n_seq_max, engine=b.engine,
                           model=str(b.model_path or default_model_path()), node=b.node_id or "")
                for b in self.config.backends
            ]
        demand = (policy.budget_tokens or 0) if policy.kind != "none" else 0
        backend = str(ray.get(self.planner.place.remote(
            session_id, None if model is None else os.fspath(model),
            PlacementPolicy.of(placement, self.config.placement.policy()), policy.kind, demand, seeds,
        )))
        self._placement_seeded = True
        return backend

    def open_session(
        self,
        model: str | os.PathLike[str] | None = None,
        policy: SessionPolicy | None = None,
        session_id: str | None = None,
        backend: str | None = None,
        placement: PlacementPolicy | str | None = None,
    ) -> Session:
        """Open a session on ``backend``, or where ``placement`` (default: the configuration's)
        puts it among the backends of ``model``. A constant number of Ray calls: the planner's
        answer (or registration) and the backend's opening."""
        policy = policy or self.config.default_policy
        session_id = session_id or f"s-{uuid.uuid4().hex[:12]}"
        placed = backend is None
        if backend is None:
            backend = self._place(model, policy, session_id, placement)
        handle = self.backend_handle(backend)
        try:
            ray.get(handle.open_session.remote(session_id, policy))
        except BaseException:
            if placed:
                ray.get(self.planner.forget.remote(session_id))  # never opened: not pending there
            raise
        if not placed:
            ray.get(self.planner.register.remote(session_id, backend))
        return Session(self, session_id, backend)

    def session(self, session_id: str) -> Session:
        backend: str | None = ray.get(self.planner.where.remote(session_id))
        if backend is None:
            raise UnknownSessionError(session_id)
        return Session(self, session_id, backend)

    def migrate(self, session: Session, backend: str) -> None:
        target = self.backend_handle(backend)
        if backend == session.backend:
            return
        source = self.backend_handle(session.backend)
        record = ray.get(source.detach.remote(session.session_id))
        try:
            ray.get(target.resume.remote(session.session_id, record))
        except Exception:
            ray.get(source.resume.remote(session.session_id, record))  # nothing lost: back home
            raise
        ray.get(self.planner.register.remote(session.session_id, backend))
        session.backend = backend

    def status(self, detail: bool = True) -> dict[str, Any]:
        """The cluster: ``load`` is the planner's load view (one call, whatever the size);
        ``backends`` each backend's own stats (one call per backend, sent together), or with
        ``detail=False`` the load view's rows."""
        load = self.planner.load.remote()
        stats = [h.stats.remote() for h in self._backends.values()] if detail else []
        stores = [s.stats.remote() for s in self.cold_stores.values()]
        view = ray.get(load)
        return {
            "namespace": self.namespace,
            "backends": ray.get(stats) if detail else view["backends"],
            "load": view,
            "cold_stores": dict(zip(self.cold_stores, ray.get(stores), strict=True)),
            "sessions": ray.get(self.planner.directory.remote()),
        }

    def shutdown(self) -> None:
        """Stop kvres's actors (and the local Ray cluster if ``connect`` started it)."""
        for handle in [*self._backends.values(), *self.cold_stores.values(), self.planner]:
            ray.kill(handle)
        self._backends.clear()
        if self._started_ray:
            ray.shutdown()


def connect(
    address: str | None = None, namespace: str = "kvres", config: KvresConfig | None = None,
    **ray_init: Any,
) -> SessionManager:
    config = config or KvresConfig.from_env()
    started = False
    if not ray.is_initialized():
        address = address or os.environ.get("RAY_ADDRESS")
        # no address: start an embedded local cluster ("local"), never a stray one found running
        ray.init(address=address or "local", namespace=namespace, log_to_driver=False, **ray_init)
        started = address is None
    return SessionManager(namespace, config, started)
