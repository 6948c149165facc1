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
  ``Session.export`` wrote; a path that names no readable file: ``SessionFileError``),
  ``backends()``, ``status(detail=True)``, ``shutdown(keep_blocks=False)`` (also removes the
  namespace's cold blocks and store folders unless told to keep them).
- ``ConnectError`` (``actor_ops``): a kvres actor could not start; ``connect`` then leaves nothing running.
  A backend that cannot start (its engine raised, or its process died starting
  ``START_ATTEMPTS`` times in a row: ``kvres.actors.ray_actors.start_attempts``) fails
  ``connect`` and ``add_backend`` with a ``ConnectError`` naming it and the engine's error (its
  cause a ``BackendStartError``); one that fails later (restarted after a crash) is not started
  again by calls: each call on its sessions raises ``BackendStartError`` at once, ``status()``
  shows it failed with the reason, and a later ``connect()`` starts it anew.
- ``Session`` (``kvres.cluster.session_handle``): what ``open_session`` and ``session`` return.

Each call is one Ray call (generation is batched inside the backend, never one remote call per
token), made through the typed clients of the backends (``BackendClient``) and the planner
(``PlannerClient``); errors raised by the actors arrive as their kvres types.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import re
import time
import uuid
from collections.abc import Callable, Iterable
from typing import Any

import ray
from ray.exceptions import ActorUnschedulableError, RayActorError
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from kvres.actors.backend_setup.engine_registry import kv_layout_of
from kvres.actors.backend_setup.engine_threads import engine_process_env
from kvres.actors.cluster_secrets import cluster_secret, coldstore_secret_name, forget_secret
from kvres.actors.default_model import default_model_path, model_key
from kvres.actors.host.journal import SessionRecord
from kvres.actors.metrics import label_secret
from kvres.actors.ray_actors.backend_actor import BackendActor, backend_actor_name
from kvres.actors.ray_actors.coldstore_actor import MeteredColdStoreActor
from kvres.actors.ray_actors.nodes import cold_store_name, store_node_dead
from kvres.actors.ray_actors.planner_actor import PLANNER_NAME, PlannerActor
from kvres.actors.ray_actors.ray_journal import RayDirectory, RayJournal
from kvres.actors.ray_actors.start_attempts import forget_start, forget_starts, start_failure, start_state
from kvres.actors.settings import read_settings
from kvres.coldstore import new_secret, validate_session_id
from kvres.coldstore.session_file import peek_session
from kvres.policy import ArgumentError, KvresError, SessionExistsError, UnknownSessionError
from kvres.policy.errors import BackendLostError, NodeLostError, PlannerLostError
from kvres.policy.placement import PlacementError, PlacementPolicy, serves

from .actor_ops import CONNECT_UNDONE, actor_exists, destroy_stores, start_error, status_row
from .actor_ops import ConnectError as ConnectError  # re-exported: where callers import it from
from .backend_client import BackendClient
from .config_agreement import check_agreement
from .failover import Failover, seeds
from .gcs_config import publish_config, published_config
from .kvres_config import BackendConfig, KvresConfig, SessionPolicy
from .planner_client import PlannerClient
from .ray_auth import follow_local_token
from .ray_task_events import actor_task_events, started_cluster_config
from .ray_upkeep import started_with_upkeep
from .reachability import check_reachable
from .remote_calls import wait_until_answers
from .restarts import sweep_previous_runs, unknown_session
from .session_files import read_session_file
from .session_handle import Session

log = logging.getLogger("kvres.cluster")
RESTARTING_WAIT_S = 120.0  # how long a start waits on a backend Ray is restarting (after a head's restart)


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
                if self._failover.lost(backend.name):  # pinned to a dead node: not created again
                    self._backends[backend.name] = None
                    continue
                self._backends[backend.name] = self._adopt(
                    backend_actor_name(backend.name), functools.partial(self._ensure_backend, backend)
                )
            self._await_backends(self._backends)
            self._collect_orphans()
            sweep_previous_runs(namespace, self.cold_stores)  # folders an earlier run left on the nodes
        except BaseException:
            self._undo_start()
            raise

    @property
    def _failover(self) -> Failover:
        """Backends lost with their node, and where their sessions went (made on first use)."""
        found: Failover | None = self.__dict__.get("_failover_view")
        if found is None:
            found = self.__dict__["_failover_view"] = Failover(self)
        return found

    # -- actors ----------------------------------------------------------------------------
    def _collect_orphans(self) -> None:
        """Have every cold store drop the blocks of sessions the journal no longer holds (left by
        a crash, or closed while their store was down); sent without waiting for the answer."""
        live = RayJournal(self.namespace).session_ids()
        for store in self.cold_stores.values():
            store.collect_orphans.remote(live)

    def _adopt(self, name: str, create: Callable[[], Any]) -> Any:
        """``create()`` the named actor (or get it); one new is killed again if this manager fails to start."""
        existed = actor_exists(name, self.namespace)
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
                raise start_error(kind, name, exc) from exc

    def _await_backends(self, names: Iterable[str], undone: str = CONNECT_UNDONE) -> None:
        """Each backend answers once started; one that could not start raises a ``ConnectError`` with the
        engine's error (``start_attempts``); one Ray is restarting is waited for ``RESTARTING_WAIT_S``."""
        calls = {n: self.backend(n).ping_ref() for n in names if self._backends.get(n) is not None}
        for name, ref in calls.items():
            deadline = time.monotonic() + RESTARTING_WAIT_S
            while True:
                try:
                    ray.get(ref)
                    break
                except ray.exceptions.RayActorError as exc:
                    failure = start_failure(self.namespace, name)
                    restarting = isinstance(exc, ray.exceptions.ActorUnavailableError)  # (a head restarted)
                    if not restarting or failure is not None or time.monotonic() > deadline:
                        raise start_error("backend", name, exc, failure, undone) from failure or exc
                    time.sleep(0.5)
                    ref = self.backend(name).ping_ref()

    def _undo_start(self) -> None:
        """Kill the actors this manager created (its new cold stores' folders removed first), not those
        it found running; a backend killed while starting leaves no record, one that failed keeps its reason."""
        destroy_stores(self._created_stores)
        for handle in self._created:
            ray.kill(handle)
        for name, handle in self._backends.items():
            if any(handle is h for h in self._created) and start_failure(self.namespace, name) is None:
                forget_start(self.namespace, name)
        self._created.clear()
        self._created_stores.clear()

    def _ensure_cold_stores(self) -> dict[str, Any]:
        """One store per alive node, with the namespace's block secret (made once per namespace and
        cluster, kept in Ray's GCS and the stores' memory only) and its disk tier in ``<disk_dir>/<namespace>-
        <store name>`` or, without ``disk_dir``, in the user's private cache on that node (0700)."""
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
                    max_restarts=-1, **actor_task_events(),
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
        evicting = not self.config.default_policy.residency.keeps_every_token
        layout = kv_layout_of(cfg, evicting_sessions=evicting)
        if evicting and layout is not None and layout.chosen:
            # the sessions it opens by default evict from their middle, which the split layout cannot
            cfg = cfg.model_copy(update={"kv_layout": layout.layout})
        if not actor_exists(backend_actor_name(cfg.name), self.namespace):
            forget_start(self.namespace, cfg.name)  # created anew: an earlier failure no longer holds
        options: dict[str, Any] = {
            "name": backend_actor_name(cfg.name), "namespace": self.namespace, "get_if_exists": True,
            "lifetime": "detached", "num_cpus": 0, "num_gpus": cfg.num_gpus, "max_restarts": -1,
            **actor_task_events(),
        }
        if wait := engine_process_env():  # the operator's choice of how engine threads wait, wherever it runs
            options["runtime_env"] = {"env_vars": wait}
        if cfg.node_id:
            options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(cfg.node_id, soft=False)
        return BackendActor.options(**options).remote(cfg, self.namespace)

    def _ensure_planner(self) -> Any:
        return PlannerActor.options(
            name=PLANNER_NAME, namespace=self.namespace, get_if_exists=True, lifetime="detached", num_cpus=0,
            max_restarts=-1, **actor_task_events(),
        ).remote(self.namespace)

    # -- calls that survive an actor's death ------------------------------------------------
    # Every kvres actor restarts when it dies (Ray restarts it, with the arguments it was created
    # with); one killed for good is created again from this configuration. A call that met a death
    # waits for the actor to answer again and is repeated once (see remote_calls). A backend that
    # could not start (start_attempts) is neither waited for nor created again: BackendStartError.
    def backend(self, name: str) -> BackendClient:
        """The typed client of backend ``name`` (a ``KvresError`` naming the known ones if none)."""
        self.backend_handle(name)
        return BackendClient(name, lambda: self.backend_handle(name), lambda: self.revive_backend(name),
                             self._lease, routes=self._failover)

    @property
    def planner_client(self) -> PlannerClient:
        return PlannerClient(lambda: self.planner, self.revive_planner)

    def revive_backend(self, name: str) -> None:
        cfg = next((b for b in self.config.backends if b.name == name), None)

        def ping() -> Any:
            self._failover.check(name)  # NodeLostError when it was pinned to a node that died
            failure = start_failure(self.namespace, name)
            if failure is not None:
                raise failure
            try:
                self._backends[name] = ray.get_actor(backend_actor_name(name), namespace=self.namespace)
            except ValueError:
                if cfg is None:
                    raise
                self._failover.check(name, fresh=True)  # pinned to a node that died: not started again
                self._backends[name] = self._ensure_backend(cfg)  # killed for good: start it again
            return self.backend(name).ping_ref()

        try:
            wait_until_answers(ping, BackendLostError, f"backend {name!r}")
        except (ActorUnschedulableError, BackendLostError) as exc:  # Ray cannot place it: its node died?
            self._failover.check(name, fresh=True)
            if isinstance(exc, BackendLostError):
                raise
            raise BackendLostError(f"backend {name!r} cannot be placed ({type(exc).__name__}); check `kvres "
                                   "status` and the cluster's resources") from None

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
            pass
        published = published_config(self.namespace)  # another driver may have added it since
        added = None if published is None else next((b for b in published.backends if b.name == name), None)
        if added is None or not actor_exists(backend_actor_name(name), self.namespace):
            raise KvresError(f"unknown backend {name!r}; known: {sorted(self._backends)}")
        self.config = self.config.model_copy(update={"backends": [*self.config.backends, added]})
        self._backends[name] = ray.get_actor(backend_actor_name(name), namespace=self.namespace)
        return self._backends[name]

    def backends(self) -> list[str]:
        return list(self._backends)

    def add_backend(self, backend: BackendConfig) -> None:
        """Start one more backend in this cluster, and publish the configuration with it, so every
        later driver has it too (a driver's ``config=`` may not add one by itself)."""
        if not isinstance(backend, BackendConfig):
            raise ArgumentError(f"add_backend takes a BackendConfig, got {type(backend).__name__} {backend!r}")
        if backend.name in self._backends:
            raise KvresError(f"backend {backend.name!r} already runs in namespace {self.namespace!r}")
        config = self.config.model_copy(update={"backends": [*self.config.backends, backend]})
        self._backends[backend.name] = self._adopt(backend_actor_name(backend.name),
                                                   functools.partial(self._ensure_backend, backend))
        try:
            self._await_backends([backend.name], undone="it was not added")
        except ConnectError:
            del self._backends[backend.name]
            raise
        self.config = config
        self._placement_seeded = False  # the next placement hands the planner the new backend
        publish_config(self.namespace, config)

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
        if model is not None and not isinstance(model, (str, os.PathLike)):
            raise ArgumentError(f"model must be a model file's path (a str or a path) or None, got "
                                f"{type(model).__name__} {model!r}")
        seeded = seeds(self.config)
        residency = policy.residency
        planner = self.planner_client
        args = (session_id, None if model is None else model_key(model),
                PlacementPolicy.of(placement, self.config.placement.policy()), residency.engine_need,
                residency.enforced_budget_tokens or 0)
        try:
            placed = planner.place(*args, [] if getattr(self, "_placement_seeded", False) else seeded)
        except PlacementError:
            placed = planner.place(*args, seeded)
        if placed is None:  # the planner placed it, then died before answering
            placed = planner.where(session_id)
        self._placement_seeded = True
        return str(placed)

    def open_session(
        self,
        model: str | os.PathLike[str] | None = None,
        policy: SessionPolicy | None = None, session_id: str | None = None, backend: str | None = None,
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
            backend, placed = self._place_new(model, policy, session_id, placement)
        try:
            client = self.backend(backend)  # a known backend, or a KvresError naming the known ones
            client.open_session(session_id, policy)
        except SessionExistsError:
            raise  # the backend has a session of that id: the directory points where it is
        except BaseException:
            if placed:
                self.planner_client.forget(session_id)  # never opened: not pending there
            raise
        if not placed:
            self.planner_client.register(session_id, backend)
        return Session(self, session_id, backend)

    def _place_new(self, model: str | os.PathLike[str] | None, policy: SessionPolicy, session_id: str,
                   placement: PlacementPolicy | str | None) -> tuple[str, bool]:
        """(backend, placed): where placement puts ``session_id``; for an id the directory lists, the
        backend of ``model`` listing it (it refuses an id it has, takes one whose opener died)."""
        try:
            return self._place(model, policy, session_id, placement), True
        except SessionExistsError:
            listed = self.planner_client.where(session_id)
            report = next((r for r in seeds(self.config) if r.backend == listed), None)
            if report is None or not serves(report, None if model is None else model_key(model)):
                raise
            return report.backend, False

    def session(self, session_id: str) -> Session:
        validate_session_id(session_id)
        backend = self.planner_client.where(session_id)
        if backend is None:
            raise unknown_session(self.namespace, session_id)  # says so when the cluster was restarted
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
        data = read_session_file(path)
        image_id, policy_fields = peek_session(data)
        policy = SessionPolicy.model_validate(policy_fields)
        session_id = session_id or image_id
        validate_session_id(session_id)
        placed = backend is None
        if backend is None:
            backend, placed = self._place_new(model, policy, session_id, None)
        else:
            self.backend(backend)  # a known backend, or a KvresError naming the known ones
            if self.planner_client.where(session_id) is not None:
                raise SessionExistsError(session_id)  # before the open session's directory entry is touched
            self.planner_client.register(session_id, backend)
        try:
            self.backend(backend).restore(data, session_id)
        except SessionExistsError:
            raise  # the backend has a session of that id: the directory points where it is
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
        """Move ``session`` to ``backend``. From a backend lost with its node the session moves
        with its journal record (its blocks there are gone: recomputed from its log)."""
        target = self.backend(backend)
        if self._failover.lost(session.backend):
            session.backend = self.planner_client.where(session.session_id) or session.backend
        if backend == session.backend:
            return
        try:
            record = None if self._failover.lost(session.backend) else self._detach(session)
        except (NodeLostError, ActorUnschedulableError):
            if not self._failover.lost(session.backend, fresh=True):
                raise
            record = None
        if record is None:  # its backend was lost with its node: the session moves from its journal record
            record = self._failover.record_of(session.session_id, session.backend)
            with contextlib.suppress(SessionExistsError):  # a repeat: the first attempt resumed it there
                target.resume(session.session_id, record, retry_ok=(SessionExistsError,))
            self.planner_client.register(session.session_id, backend)
            session.backend = backend
            return
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
        ``{"error": ...}`` in its row instead of failing the whole status; so does a backend that
        is starting (``starting: attempt k of N``, not waited for) or could not start (its
        ``BackendStartError``: the engine's error)."""
        lost = {n: row for n in self._backends if (row := self._failover.status_row(n)) is not None}
        starts = {n: {"backend": n, "error": state} for n in self._backends
                  if n not in lost and (state := start_state(self.namespace, n)) is not None}
        lost |= starts
        stats = {n: self.backend(n).stats_ref() for n in self._backends if n not in lost} if detail else {}
        gone = {n for n in self.cold_stores if store_node_dead(n)}
        stores = {n: s.stats.remote() for n, s in self.cold_stores.items() if n not in gone}
        view = self.planner_client.load()
        rows = {**{name: status_row(ref, backend=name) for name, ref in stats.items()}, **lost}
        return {
            "namespace": self.namespace,
            "backends": [rows[n] for n in self._backends] if detail else [*view["backends"], *starts.values()],
            "load": view,
            "cold_stores": {name: {"error": "node dead: store gone"} if name in gone else status_row(stores[name])
                            for name in self.cold_stores},
            "sessions": self.planner_client.directory(),
        }

    def shutdown(self, keep_blocks: bool = False) -> None:
        """Stop kvres's actors (and the local Ray cluster if ``connect`` started it).

        First the backends (no block is written after that), then, unless ``keep_blocks``, every
        block in the namespace's cold stores is dropped, their folders removed (with those left on
        their machines by stores whose node died) and the namespace's
        block secret forgotten, and the sessions' journal and directory cleared: nothing of its
        sessions stays. With ``keep_blocks=True`` the blocks, the journal, the directory and the
        secret stay, for a later ``connect`` of the namespace on the same standing cluster, whose
        backends rebuild each session on its first call; blocks kept by an embedded cluster cannot be authenticated once it has
        ended, and are refused (and deleted) when read."""
        for handle in self._backends.values():
            if handle is not None:
                ray.kill(handle)
        self._backends.clear()
        if not keep_blocks:
            live = {n: s for n, s in self.cold_stores.items() if not store_node_dead(n)}
            sweep_previous_runs(self.namespace, live)  # the folders of stores that died with their node
            destroy_stores(list(live.values()))
            forget_secret(coldstore_secret_name(self.namespace))
            RayJournal(self.namespace).clear()  # and the sessions' records: nothing of them is left
            RayDirectory(self.namespace).clear()
        forget_starts(self.namespace)
        for handle in [*self.cold_stores.values(), self.planner]:
            ray.kill(handle)
        if self._started_ray:
            ray.shutdown()


def connect(
    address: str | None = None, namespace: str = "kvres", config: KvresConfig | None = None,
    **ray_init: Any,
) -> SessionManager:
    """Attach to the Ray cluster at ``address`` (or ``RAY_ADDRESS``) and find or start kvres's
    actors there; returns the driver's ``SessionManager``. Without ``config``: ``KVRES_CONFIG`` when
    set, else the configuration ``kvres start`` created the namespace's actors with, else defaults.

    Without an address an embedded local cluster is started, and it ends when this driver exits:
    every session on it ends with it (this is logged); it bounds Ray's task-event store
    (``ray_task_events.TASK_EVENT_STORE``, under a ``_system_config`` given). kvres's actors report no
    task events wherever they are created. For sessions that outlive drivers run a standing cluster
    (``kvres start``, or ``ray start --head``) and connect to its address: kvres's actors are
    detached there, restart when they die, and any driver may exit.
    """
    started = False
    if not ray.is_initialized():
        address = address or os.environ.get("RAY_ADDRESS")
        if address:
            follow_local_token()  # a head started here with token authentication: speak it too
        # no address: start an embedded local cluster ("local"), never a stray one found running
        if address and address not in ("auto", "local") and "://" not in address:
            check_reachable(address)  # seconds, not the minutes ray.init retries for
        starting = (address or "local") == "local"  # a cluster started here: Ray's task-event store bounded
        if starting:
            ray_init["_system_config"] = started_cluster_config(ray_init.get("_system_config"))
        with started_with_upkeep() if starting else contextlib.nullcontext():  # and its upkeep small
            ray.init(address=address or "local", namespace=namespace, log_to_driver=False, **ray_init)
        started = address is None
        if started:
            log.warning("kvres started an embedded Ray cluster for this driver: its sessions end when the driver "
                        "exits (run `kvres start` and connect(address=...) for a standing cluster)")
    try:
        # one configuration per cluster: the one published by `kvres start` or the first driver;
        # a driver's own (config=, or KVRES_CONFIG) must agree with it
        published = None if started else published_config(namespace)
        if config is None and read_settings().config:
            config = KvresConfig.from_env()
        if config is None:
            config = published or KvresConfig.from_env()
        elif published is not None:
            check_agreement(config, published, namespace)
            config = published.model_copy(update={"default_policy": config.default_policy})
        manager = SessionManager(namespace, config, started)
        if published is None and not started:
            publish_config(namespace, config)
        return manager
    except BaseException:
        if started:
            ray.shutdown()  # the embedded cluster this call started ends with it
        raise
