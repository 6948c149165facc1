"""What a driver holds: the session manager and its sessions.

Primitives:
- ``connect(address=None, namespace="kvres", config=None) -> SessionManager``: attach to a running
  Ray cluster (``address`` or RAY_ADDRESS) or start a local one, then find or create the named
  actors: the planner, one cold store per node, the configured backends.
- ``SessionManager``: ``open_session(model=None, policy=None, session_id=None, backend=None,
  placement=None)`` (placed by the planner from the load backends push: one Ray call whatever the
  number of backends; a session id is ASCII letters, digits, ``.``, ``_``, ``-``, not starting
  with ``.``, at most 128 characters, else ``InvalidSessionIdError``), ``session(session_id)``,
  ``sessions()`` (every open session), ``fork(session, new_id)``, ``restore(path)`` (a session
  ``Session.export`` wrote),
  ``backends()``, ``status(detail=True)``, ``shutdown(keep_blocks=False)`` (also removes the
  namespace's cold blocks and store folders unless told to keep them).
- ``ConnectError``: a kvres actor could not start; ``connect`` then leaves nothing running.
- ``Session`` (``kvres.cluster.session_handle``): what ``open_session`` and ``session`` return.

Each call is one Ray call (generation is batched inside the backend, never one remote call per
token), made through the typed clients of the backends (``BackendClient``) and the planner
(``PlannerClient``); errors raised by the actors arrive as their kvres types.
"""

from __future__ import annotations

import functools
import logging
import os
import re
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import ray
from ray.exceptions import RayActorError
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from kvres.actors.cluster_secrets import cluster_secret, coldstore_secret_name, forget_secret
from kvres.actors.default_model import default_model_path
from kvres.actors.host.journal import RayDirectory, RayJournal, SessionRecord
from kvres.actors.host.store_ports import cold_store_name
from kvres.actors.metrics import label_secret
from kvres.actors.ray_actors.backend_actor import BackendActor, backend_actor_name
from kvres.actors.ray_actors.coldstore_actor import MeteredColdStoreActor
from kvres.actors.ray_actors.planner_actor import PLANNER_NAME, PlannerActor
from kvres.actors.residency import residency_for
from kvres.coldstore import new_secret, validate_session_id
from kvres.coldstore.session_file import peek_session
from kvres.policy import ArgumentError, KvresError, SessionExistsError, UnknownSessionError
from kvres.policy.errors import BackendLostError, PlannerLostError
from kvres.policy.placement import LoadReport, PlacementError, PlacementPolicy

from .backend_client import BackendClient
from .config import BackendConfig, KvresConfig, SessionPolicy
from .gcs_config import published_config
from .planner_client import PlannerClient
from .ray_auth import follow_local_token
from .reachability import check_reachable
from .remote_calls import answer, wait_until_answers
from .session_handle import Session

log = logging.getLogger("kvres.cluster")


class ConnectError(KvresError, RuntimeError):
    """A kvres actor could not start (its own error is quoted); nothing was left running."""


_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _start_error(kind: str, name: str, exc: BaseException) -> ConnectError:
    """The actor's own error (the last line Ray quotes of its creation task) as a kvres error."""
    text = _ANSI.sub("", str(getattr(exc, "error_msg", None) or exc)).strip()
    cause = text.splitlines()[-1].strip() if text else type(exc).__name__
    return ConnectError(
        f"{kind} {name!r} could not start: {cause} (the actors this connect() created are stopped)"
    )


def _destroy_stores(stores: Sequence[Any], timeout_s: float = 60.0) -> None:
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


def _actor_exists(name: str, namespace: str) -> bool:
    try:
        ray.get_actor(name, namespace=namespace)
    except ValueError:
        return False
    return True


class SessionManager:
    def __init__(self, namespace: str, config: KvresConfig, started_ray: bool) -> None:
        self.namespace = namespace
        self.config = config
        self._started_ray = started_ray
        self._created: list[Any] = []  # actors this manager created, undone if it fails to start
        self._created_stores: list[Any] = []
        self.cold_stores: dict[str, Any] = {}
        self._backends: dict[str, Any] = {}
        self._lease = ray.put(b"kvres-driver")  # owned here: a backend streaming to us sees our death
        try:
            label_secret()  # the cluster's metric labels: this driver decides if it is the first
            self.planner: Any = self._adopt(PLANNER_NAME, self._ensure_planner)
            self.cold_stores = self._ensure_cold_stores()
            for backend in config.backends:
                self._backends[backend.name] = self._adopt(
                    backend_actor_name(backend.name), functools.partial(self._ensure_backend, backend)
                )
            self._await_started("backend", {n: self.backend(n).ping_ref() for n in self._backends})
            self._collect_orphans()
        except BaseException:
            self._undo_start()
            raise

    # -- actors ----------------------------------------------------------------------------
    def _collect_orphans(self) -> None:
        """Have every cold store drop the blocks of sessions the journal no longer holds (left by
        a crash, or closed while their store was down); sent without waiting for the answer."""
        live = RayJournal(self.namespace).session_ids()
        for store in self.cold_stores.values():
            store.collect_orphans.remote(live)

    def _adopt(self, name: str, create: Callable[[], Any]) -> Any:
        """``create()`` the named actor (or get it: every option says ``get_if_exists``); one that
        did not exist before is recorded, to be killed again if this manager fails to start."""
        existed = _actor_exists(name, self.namespace)
        handle = create()
        if not existed:
            self._created.append(handle)
        return handle

    @staticmethod
    def _await_started(kind: str, calls: dict[str, Any]) -> None:
        for name, ref in calls.items():
            try:
                ray.get(ref)
            except ray.exceptions.RayActorError as exc:
                raise _start_error(kind, name, exc) from exc

    def _undo_start(self) -> None:
        """Kill the actors this manager created (the folders of its new cold stores removed
        first); actors it found running, which others may use, are left alone."""
        _destroy_stores(self._created_stores)
        for handle in self._created:
            ray.kill(handle)
        self._created.clear()
        self._created_stores.clear()

    def _ensure_cold_stores(self) -> dict[str, Any]:
        """One store per alive node, with the namespace's block secret (made once per namespace
        and cluster, kept in Ray's GCS and the stores' memory only) and its disk tier in
        ``<disk_dir>/<namespace>-<store name>`` or, without ``disk_dir``, in the user's private
        cache on that node (``<user cache>/kvres/coldstore/<namespace>-<store name>``, 0700)."""
        stores: dict[str, Any] = {}
        cfg = self.config.cold_store
        secret = cluster_secret(coldstore_secret_name(self.namespace), new_secret)
        for node in ray.nodes():  # type: ignore[no-untyped-call]
            if not node.get("Alive"):
                continue
            node_id = node["NodeID"]
            name = cold_store_name(node_id)
            folder = re.sub(r"[^A-Za-z0-9_.-]", "_", f"{self.namespace}-{name}")  # per namespace and node
            disk = str(cfg.disk_dir / folder) if cfg.disk_dir else None
            stores[name] = self._adopt(name, functools.partial(
                MeteredColdStoreActor.options(
                    name=name, namespace=self.namespace, get_if_exists=True, lifetime="detached",
                    num_cpus=0, scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False),
                    max_restarts=-1,
                ).remote, cfg.ram_budget_bytes, disk, cfg.disk_budget_bytes, secret=secret,
                cache_folder=None if disk else folder,
            ))
            if self._created and self._created[-1] is stores[name]:
                self._created_stores.append(stores[name])
        self._await_started("cold store", {n: s.stats.remote() for n, s in stores.items()})
        return stores

    def _ensure_backend(self, cfg: BackendConfig) -> Any:
        if cfg.model_path is None:
            cfg = cfg.model_copy(update={"model_path": default_model_path()})
        options: dict[str, Any] = {
            "name": backend_actor_name(cfg.name), "namespace": self.namespace, "get_if_exists": True,
            "lifetime": "detached", "num_cpus": 0, "num_gpus": cfg.num_gpus, "max_restarts": -1,
        }
        if cfg.node_id:
            options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(cfg.node_id, soft=False)
        return BackendActor.options(**options).remote(cfg, self.namespace)

    def _ensure_planner(self) -> Any:
        return PlannerActor.options(
            name=PLANNER_NAME, namespace=self.namespace, get_if_exists=True, lifetime="detached", num_cpus=0,
            max_restarts=-1,
        ).remote(self.namespace)

    # -- calls that survive an actor's death ------------------------------------------------
    # Every kvres actor restarts when it dies (Ray restarts it, with the arguments it was created
    # with); one killed for good is created again from this configuration. A call that met a death
    # waits for the actor to answer again and is repeated once (see remote_calls).
    def backend(self, name: str) -> BackendClient:
        """The typed client of backend ``name`` (a ``KvresError`` naming the known ones if none)."""
        self.backend_handle(name)
        return BackendClient(name, lambda: self.backend_handle(name), lambda: self.revive_backend(name),
                             self._lease)

    @property
    def planner_client(self) -> PlannerClient:
        return PlannerClient(lambda: self.planner, self.revive_planner)

    def revive_backend(self, name: str) -> None:
        cfg = next((b for b in self.config.backends if b.name == name), None)

        def ping() -> Any:
            try:
                self._backends[name] = ray.get_actor(backend_actor_name(name), namespace=self.namespace)
            except ValueError:
                if cfg is None:
                    raise
                self._backends[name] = self._ensure_backend(cfg)  # killed for good: start it again
            return self.backend(name).ping_ref()

        wait_until_answers(ping, BackendLostError, f"backend {name!r}")

    def revive_planner(self) -> None:
        def ping() -> Any:
            try:
                self.planner = ray.get_actor(PLANNER_NAME, namespace=self.namespace)
            except ValueError:
                self.planner = self._ensure_planner()
            return self.planner_client.directory_ref()

        wait_until_answers(ping, PlannerLostError, "the planner")

    def backend_handle(self, name: str) -> Any:
        if not isinstance(name, str):
            raise ArgumentError(f"a backend name is a str, got {type(name).__name__} {name!r}")
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
        reported yet counts as empty; so does a call that finds the planner without them (it was
        restarted)."""
        seeds = [
            LoadReport(b.name, b.kv_budget_tokens, n_seq_max=b.n_seq_max, engine=b.engine,
                       model=str(b.model_path or default_model_path()), node=b.node_id or "")
            for b in self.config.backends
        ]
        residency = residency_for(policy)
        planner = self.planner_client
        args = (session_id, None if model is None else os.fspath(model),
                PlacementPolicy.of(placement, self.config.placement.policy()), residency.engine_need,
                residency.bounded_tokens or 0)
        try:
            placed = planner.place(*args, [] if getattr(self, "_placement_seeded", False) else seeds)
        except PlacementError:
            placed = planner.place(*args, seeds)
        if placed is None:  # the planner placed it, then died before answering
            placed = planner.where(session_id)
        self._placement_seeded = True
        return str(placed)

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
        if session_id is not None:
            validate_session_id(session_id)  # before anything is placed or registered
        if policy is not None and not isinstance(policy, SessionPolicy):
            raise ArgumentError(f"policy must be a SessionPolicy, got {type(policy).__name__} {policy!r}")
        policy = policy or self.config.default_policy
        session_id = session_id or f"s-{uuid.uuid4().hex[:12]}"
        placed = backend is None
        if backend is None:
            backend = self._place(model, policy, session_id, placement)
        client = self.backend(backend)  # a known backend, or a KvresError naming the known ones
        try:
            client.open_session(session_id, policy)
        except BaseException:
            if placed:
                self.planner_client.forget(session_id)  # never opened: not pending there
            raise
        if not placed:
            self.planner_client.register(session_id, backend)
        return Session(self, session_id, backend)

    def session(self, session_id: str) -> Session:
        validate_session_id(session_id)
        backend = self.planner_client.where(session_id)
        if backend is None:
            raise UnknownSessionError(session_id)
        return Session(self, session_id, backend)

    def sessions(self) -> list[Session]:
        """Every open session of the namespace (the planner's directory), in id order."""
        return [Session(self, sid, backend) for sid, backend in sorted(self.planner_client.directory().items())]

    def restore(
        self, path: str | os.PathLike[str], session_id: str | None = None, backend: str | None = None,
        model: str | os.PathLike[str] | None = None,
    ) -> Session:
        """A session from a file ``Session.export`` wrote (this cluster's secret authenticates it),
        opened on ``backend`` or where placement puts a session of ``model`` and of the file's
        policy; its KV is imported where this backend can take it and recomputed from its log
        where not. ``session_id`` defaults to the exported session's id."""
        data = Path(path).read_bytes()
        image_id, policy_fields = peek_session(data)
        policy = SessionPolicy.model_validate(policy_fields)
        session_id = session_id or image_id
        validate_session_id(session_id)
        placed = backend is None
        if backend is None:
            backend = self._place(model, policy, session_id, None)
        else:
            self.planner_client.register(session_id, backend)
        try:
            self.backend(backend).restore(data, session_id)
        except BaseException:
            self.planner_client.forget(session_id)
            raise
        if placed:
            self.planner_client.register(session_id, backend)
        return Session(self, session_id, backend)

    def fork(self, session: Session, new_id: str | None = None) -> Session:
        """A new session on ``session``'s backend from its state (``Session.fork``)."""
        new_id = new_id or f"s-{uuid.uuid4().hex[:12]}"
        validate_session_id(new_id)
        if self.planner_client.where(new_id) is not None:
            raise SessionExistsError(new_id)
        self.backend(session.backend).fork(session.session_id, new_id)
        self.planner_client.register(new_id, session.backend)
        return Session(self, new_id, session.backend)

    def migrate(self, session: Session, backend: str) -> None:
        target = self.backend(backend)
        if backend == session.backend:
            return
        record = self._detach(session)
        try:
            target.resume(session.session_id, record, once=True)
        except Exception:
            self.backend(session.backend).resume(session.session_id, record, once=True)  # back home
            raise
        self.planner_client.register(session.session_id, backend)
        session.backend = backend

    def _detach(self, session: Session) -> SessionRecord:
        """The session's record, taken off its backend. When the backend dies during the detach
        (or answers that it no longer holds the session), the journal says how far it got: a
        record that names no backend is the one the detach committed, on its way and served by
        nobody, and the migration goes on with it; otherwise the backend, once back, still serves
        the session and the detach is sent again."""
        sid, source = session.session_id, session.backend
        try:
            return self.backend(source).detach(sid, once=True)
        except (RayActorError, UnknownSessionError) as exc:
            error = exc
        if isinstance(error, RayActorError):
            self.revive_backend(source)
        record = RayJournal(self.namespace).load(sid)
        if record is not None and record.backend == "":
            log.warning("session %r: the detach from backend %r committed but its answer was lost (%s); "
                        "migrating it from its journal record", sid, source, type(error).__name__)
            return record
        if isinstance(error, UnknownSessionError):
            raise error
        return self.backend(source).detach(sid)

    def status(self, detail: bool = True) -> dict[str, Any]:
        """The cluster: ``load`` is the planner's load view (one call, whatever the size);
        ``backends`` each backend's own stats (one call per backend, sent together), or with
        ``detail=False`` the load view's rows. An actor that is down (restarting) shows as
        ``{"error": ...}`` in its row instead of failing the whole status."""
        stats = {n: self.backend(n).stats_ref() for n in self._backends} if detail else {}
        stores = {n: s.stats.remote() for n, s in self.cold_stores.items()}
        view = self.planner_client.load()
        return {
            "namespace": self.namespace,
            "backends": [_row(ref, backend=name) for name, ref in stats.items()] if detail else view["backends"],
            "load": view,
            "cold_stores": {name: _row(ref) for name, ref in stores.items()},
            "sessions": self.planner_client.directory(),
        }

    def shutdown(self, keep_blocks: bool = False) -> None:
        """Stop kvres's actors (and the local Ray cluster if ``connect`` started it).

        First the backends (no block is written after that), then, unless ``keep_blocks``, every
        block in the namespace's cold stores is dropped, their folders removed and the namespace's
        block secret forgotten, and the sessions' journal and directory cleared: nothing of its
        sessions stays. With ``keep_blocks=True`` the blocks, the journal, the directory and the
        secret stay, for a later ``connect`` of the namespace on the same standing cluster, whose
        backends rebuild each session on its first call; blocks kept by an embedded cluster cannot be authenticated once it has
        ended, and are refused (and deleted) when read."""
        for handle in self._backends.values():
            ray.kill(handle)
        self._backends.clear()
        if not keep_blocks:
            _destroy_stores(list(self.cold_stores.values()))
            forget_secret(coldstore_secret_name(self.namespace))
            RayJournal(self.namespace).clear()  # and the sessions' records: nothing of them is left
            RayDirectory(self.namespace).clear()
        for handle in [*self.cold_stores.values(), self.planner]:
            ray.kill(handle)
        if self._started_ray:
            ray.shutdown()


def _row(ref: Any, **names: str) -> dict[str, Any]:
    try:
        return dict(answer(ref))
    except RayActorError as exc:
        return {**names, "error": f"{type(exc).__name__}: actor down (restarting)"}


def connect(
    address: str | None = None, namespace: str = "kvres", config: KvresConfig | None = None,
    **ray_init: Any,
) -> SessionManager:
    """Attach to the Ray cluster at ``address`` (or ``RAY_ADDRESS``) and find or start kvres's
    actors there; returns the driver's ``SessionManager``. Without ``config``: ``KVRES_CONFIG`` when
    set, else the configuration ``kvres start`` created the namespace's actors with, else defaults.

    Without an address an embedded local cluster is started, and it ends when this driver exits:
    every session on it ends with it (this is logged). For sessions that outlive drivers run a
    standing cluster (``kvres start``, or ``ray start --head``) and connect to its address: kvres's
    actors are detached there, restart when they die, and any driver may exit.
    """
    started = False
    if not ray.is_initialized():
        address = address or os.environ.get("RAY_ADDRESS")
        if address:
            follow_local_token()  # a head started here with token authentication: speak it too
        # no address: start an embedded local cluster ("local"), never a stray one found running
        if address and address not in ("auto", "local") and "://" not in address:
            check_reachable(address)  # seconds, not the minutes ray.init retries for
        ray.init(address=address or "local", namespace=namespace, log_to_driver=False, **ray_init)
        started = address is None
        if started:
            log.warning("kvres started an embedded Ray cluster for this driver: its sessions end when the driver "
                        "exits (run `kvres start` and connect(address=...) for a standing cluster)")
    try:
        if config is None:
            # KVRES_CONFIG when set; else what `kvres start` created the namespace with; else defaults
            explicit = bool(os.environ.get("KVRES_CONFIG"))
            config = (None if explicit or started else published_config(namespace)) or KvresConfig.from_env()
        return SessionManager(namespace, config, started)
    except BaseException:
        if started:
            ray.shutdown()  # the embedded cluster this call started ends with it
        raise
