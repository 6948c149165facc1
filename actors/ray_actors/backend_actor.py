"""The backend as a Ray actor: a thin shell around ``BackendHost``.

Primitives:
- ``BackendServer(config, namespace)``: starts within bounded attempts (``start_attempts``: an
  engine that raises fails the backend at once; a process that dies while starting, its stderr
  kept by ``engine_output.captured_stderr``, is started again by Ray at most ``START_ATTEMPTS``
  times in a row; then the backend is failed, its reason the engine's own words, in Ray's GCS, and
  the planner drops it from placement: ``start_failed``). It builds the executor (``kvres.actors.backend_setup``;
  its KV tier decision goes to the host, which runs its sessions by it; its llama.cpp KV layout,
  where the config leaves it, is chosen from its sizes), finds this node's cold
  store by name (``RayStorePort``; the journal is ``RayJournal``), starts measuring its recall
  costs in the background where its engine takes them and can shift positions
  (``kvres.actors.sizing.recall_costs.BackgroundRecallCosts``: with its own threads and device,
  on the disk folder of this node's cold store; ``stats()["recall_costs"]`` says how far that got),
  freezes the heap it started with (``heap.freeze_startup_heap``), and forwards to its host the
  operations ``kvres.actors.host.backend_surface.BackendSurface`` declares (mypy checks this class
  against it): ``open_session``, ``append``, ``append_text``, ``generate``, ``stream`` (a Ray
  streaming generator: one object per token, or with ``chunks`` per list of the tokens out by
  then, each yield returning once the driver took it),
  ``chat``, ``append_messages``, ``cancel``, ``tokens``, ``truncate``, ``fork``, ``export``,
  ``restore``, ``suspend``, ``resume``, ``detach``, ``close``, ``session_stats``, ``tokenize``,
  ``detokenize``; and ``stats``, ``ping``, ``pid``; ``hold(session_id, hold) -> tenant``,
  ``release_hold``, ``renew_holds``: the HTTP front's request holds on sessions
  (``kvres.actors.host.holds``), which ``stream`` also takes (``hold=``) in the turn's own call.
  It measures what a caller sees: every call's latency, a stream's time to first token and the
  gaps between its tokens, the calls it holds (``kvres.actors.metrics``: kvres_call_seconds,
  kvres_time_to_first_token_seconds, kvres_inter_token_seconds, kvres_queue_depth); it counts
  the explicit suspends and resumes it is asked for (``explicit_suspends`` / ``explicit_resumes``:
  the host counts the forced ones); it says how the model load and a long append's prefill are
  going (``progress``); ``host_front`` / ``stop_front``: what the namespace published to be hosted
  in this process (``hosted``: ``kvres serve --front local``'s HTTP front; hosted again after a
  restart); it refuses a llama engine on an untested llama-cpp-python
  (``kvres.actors.pins``). Its repr holds only what never changes (engine, model, slots, budget):
  Ray records it once; live state is in ``stats()``, ``kvres status`` and ``kvres top``.
- ``BackendActor``: the Ray actor class, a threaded actor with two concurrency groups: "calls"
  (appends and generations of up to ``CALL_THREADS`` sessions at once, batched together by the
  host's step loop) and "control" (stats, suspend, resume, close, ...), so a control call never
  queues behind running generations (``_method``: ``ray.method`` keeping the method's type);
  ``backend_actor_name(name)``.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO, TypeVar, cast

import ray

from kvres.actors.backend_setup.engine_registry import engine_spec, make_executor
from kvres.actors.backend_setup.kv_config import resolve_kv_layout, resolve_kv_tier
from kvres.actors.cluster_secrets import cluster_secret, coldstore_secret_name
from kvres.actors.config import BackendConfig, SessionPolicy
from kvres.actors.default_model import default_model_path, model_key
from kvres.actors.generation import Generation, GenerationRequest
from kvres.actors.host.backend import BackendHost, SuspendRecord
from kvres.actors.host.holds import Hold, SessionHolds
from kvres.actors.host.refusals import OtherTenantsSessionError, SessionHeldError
from kvres.actors.metrics import RayMetrics
from kvres.actors.model_files import model_id
from kvres.actors.sizing.device_placement import assigned_gpu_ids, placement_for
from kvres.actors.sizing.recall_costs import BackgroundRecallCosts
from kvres.coldstore import new_secret
from kvres.policy.errors import BackendStartError

from .engine_output import captured_stderr, last_words
from .heap import freeze_startup_heap
from .hosted import NothingHostedError, start_hosted
from .load_reports import LoadReporter
from .nodes import cold_store_name
from .progress import loading, watch
from .ray_journal import RayJournal
from .ray_store_port import RayStorePort, home_stage_bytes
from .start_attempts import StartAttempts

if TYPE_CHECKING:
    from kvres.actors.host.backend_surface import BackendSurface

# Each thread Ray gives the group keeps its own memory once it has run a call (its Python thread
# state, its share of malloc's arenas): 256 threads grew a backend's memory under steady traffic
# until all had run (~10 MiB more than 64, and growing twice as fast after); calls past 64 wait in
# Ray's queue for one.
CALL_THREADS = 64
PROGRESS_TOKENS = 2048  # an append this long says how its prefill goes (after WATCH_AFTER_S)
LEASE_CHECK_S = 0.25  # how often a stream asks whether its driver is still there
# a stream's yield returns once its driver took the token (Ray's backpressure, in objects): what
# the shell yielded is what the driver took, so a stream left or orphaned keeps exactly that
STREAM_OBJECTS_AHEAD = 1


def driver_alive(lease: ray.ObjectRef[bytes]) -> bool:
    """False once the driver that owns ``lease`` has died (Ray tells the object's holders)."""
    try:
        ray.get(lease, timeout=0)
    except (ray.exceptions.OwnerDiedError, ray.exceptions.ObjectLostError):
        return False
    except ray.exceptions.GetTimeoutError:
        pass  # not here yet: the owner is alive enough to be asked
    return True
CONTROL_THREADS = 8
STORE_ANSWER_S = 60.0  # how long the recall probe waits for the cold store to name its disk folder


Method = TypeVar("Method", bound=Callable[..., Any])


def _method(concurrency_group: str, streaming: bool = False) -> Callable[[Method], Method]:
    """``ray.method`` that keeps the method's type. Ray's stubs make a decorated method a
    ``_RemoteMethodN`` of its positional types (names, defaults and keyword-only parameters gone,
    not callable), which no protocol of methods matches: mypy could not check this class against
    ``BackendSurface``. At run time ``ray.method`` only marks the function and returns it."""
    options: dict[str, Any] = {"concurrency_group": concurrency_group}
    if streaming:
        options["num_returns"] = "streaming"
        options["_generator_backpressure_num_objects"] = STREAM_OBJECTS_AHEAD
    decorate: Callable[[Method], Method] = cast(Any, ray.method)(**options)
    return decorate


def backend_actor_name(name: str) -> str:
    return f"kvres-backend-{name}"


def store_disk_folder(store_name: str, namespace: str) -> str | None:
    """The folder the node's cold store keeps its disk tiers in (the configured ``disk_dir``, or
    the default under the user's cache), None when it has no disk tier."""
    handle = ray.get_actor(store_name, namespace=namespace)
    folder: Any = ray.get(handle.disk_folder.remote(), timeout=STORE_ANSWER_S)
    return None if folder is None else str(Path(folder).parent)


def start_failed(namespace: str, backend: str) -> None:
    """The planner's load view drops a backend that could not start: placement never picks it."""
    from .planner_actor import PLANNER_NAME

    with contextlib.suppress(ValueError):  # no planner (yet): it reads the failures when it starts
        ray.get_actor(PLANNER_NAME, namespace=namespace).start_failed.remote(backend)


def forget_session(namespace: str, session_id: str) -> None:
    """The planner's directory forgets a session its backend closed by itself (its ``ttl_s``)."""
    from .planner_actor import PLANNER_NAME

    ray.get_actor(PLANNER_NAME, namespace=namespace).forget.remote(session_id)

class BackendServer:
    def __init__(self, config: BackendConfig, namespace: str) -> None:
        attempts = StartAttempts(namespace, config.name)
        try:
            attempts.begin()  # BackendStartError once START_ATTEMPTS starts in a row died
        except BackendStartError:
            start_failed(namespace, config.name)
            raise
        with captured_stderr() as output:  # what native code says before it ends the process
            attempts.output(output.path)
            try:
                self._start(config, namespace, output.stderr)
            except Exception as exc:  # the engine refused: failed at once (Ray does not restart it)
                words = last_words(output.said())
                attempts.failed(f"{type(exc).__name__}: {exc}".splitlines()[0]
                                + (f" (the engine wrote: {words})" if words else ""))
                start_failed(namespace, config.name)
                raise
        attempts.started()
        self._namespace = namespace
        self._front: Any = None
        self._front_lock = threading.Lock()
        # a front published for the namespace (kvres serve --front local) comes back with its backend
        threading.Thread(target=self._host_published_front, name="kvres-front-start", daemon=True).start()

    def _host_published_front(self) -> None:
        try:
            self.host_front(published_only=True)
        except Exception as exc:  # the backend serves its sessions through Ray all the same
            print(f"backend {self.host.name!r}: its HTTP front did not start: {type(exc).__name__}: {exc}",
                  file=sys.stderr, flush=True)

    def _start(self, config: BackendConfig, namespace: str, log: TextIO) -> None:
        self.node_id = ray.get_runtime_context().get_node_id()
        model = config.model_path or default_model_path()
        spec = engine_spec(config.engine)
        placement = placement_for(config, assigned_gpu_ids())
        config, self.tier_decision = resolve_kv_tier(config, model, placement=placement)
        config = resolve_kv_layout(config, model)
        store_name = cold_store_name(self.node_id)
        store = RayStorePort(store_name, namespace, stage_bytes=home_stage_bytes(store_name, namespace))
        self._reports = LoadReporter(config, model_key(model), self.node_id, namespace)
        size = Path(model).stat().st_size / 2**20 if Path(model).exists() else 0.0
        with loading(f"backend {config.name!r}: loading {Path(model).name} ({size:,.1f} MiB) on {config.engine}",
                     stream=log):
            executor = make_executor(config, model, placement)
        # the costs choose which parked blocks a resume recomputes, which only an engine that can
        # shift positions does (not llama.cpp's split layout): elsewhere they are not measured
        probe = spec.recall_probe if executor.capabilities().position_shift else None
        self.recall_costs = None if probe is None else BackgroundRecallCosts(
            model, probe(executor, placement),
            disk_folder=lambda: store_disk_folder(store_name, namespace))
        self.metrics = RayMetrics()
        self._in_flight = 0
        self._in_flight_lock = threading.Lock()
        self._holds = SessionHolds()
        self.host = BackendHost(
            config,
            executor,
            store=store,
            metrics=self.metrics,
            recall_costs=self.recall_costs,
            on_change=lambda: self._reports.changed(self.host),
            journal=RayJournal(namespace),
            file_secret=cluster_secret(coldstore_secret_name(namespace), new_secret),
            model_id=model_id(model),
            on_expired=lambda sid: forget_session(namespace, sid),
            tier_decision=self.tier_decision,
        )
        self._repr = (f"BackendServer({config.name}: {config.engine} {Path(model).name}, {config.n_seq_max} slots, "
                      f"{config.kv_budget_tokens}-token budget)")
        self.metrics.set_queue_depth(config.name, 0)
        self.metrics.declare_backend(config.name)
        self._reports.changed(self.host)
        if self.recall_costs is not None:  # off the call path: a resume never waits for a probe
            self.recall_costs.start()
        freeze_startup_heap()

    def __repr__(self) -> str:
        """Static facts for Ray's dashboard (its Repr column, recorded once): engine, model, slots."""
        return str(self.__dict__.get("_repr", "BackendServer(starting)"))

    @contextmanager
    def _call(self, method: str) -> Iterator[float]:
        """Count the call in the queue depth while it runs and time it (kvres_call_seconds)."""
        name = self.host.name
        with self._in_flight_lock:
            self._in_flight += 1
            self.metrics.set_queue_depth(name, self._in_flight)
        t0 = time.perf_counter()
        try:
            yield t0
        finally:
            self.metrics.observe_call(name, method, time.perf_counter() - t0)
            with self._in_flight_lock:
                self._in_flight -= 1
                self.metrics.set_queue_depth(name, self._in_flight)

    def _answered(self, method: str, t0: float) -> None:
        """A whole answer reached the caller: its first token came with it."""
        self.metrics.observe_first_token(self.host.name, method, time.perf_counter() - t0)

    @_method("control")
    def ping(self) -> str:
        return self.node_id

    @_method("control")
    def pid(self) -> int:
        """The worker process serving this actor (what an operator or a fault test signals)."""
        return os.getpid()

    @_method("control")
    def host_front(self, published_only: bool = False) -> bool:
        """Run what the namespace published to be hosted in every backend's process (``hosted``:
        ``kvres serve --front local``'s HTTP front); True once it is ready (at once where it runs)."""
        with self._front_lock:
            if self._front is None:
                self._front = start_hosted(self, self.host.name, self._namespace)
            if self._front is None:
                if published_only:
                    return False
                raise NothingHostedError(f"nothing is published to be hosted for namespace {self._namespace!r}")
            return bool(self._front.ready())

    @_method("control")
    def stop_front(self) -> None:
        with self._front_lock:
            front, self._front = self._front, None
        if front is not None:
            front.stop()

    def _take(self, session_id: str, hold: Hold) -> None:
        """The session held for ``hold.holder`` (free, expired or already its own), else
        ``SessionHeldError``; a ``fence`` naming another tenant than the session's is answered as
        an unknown session."""
        if hold.fence is not None and self.host.tenant_of(session_id) != hold.fence[0]:
            raise OtherTenantsSessionError(session_id)
        if not self._holds.acquire(session_id, hold.holder, hold.ttl_s):
            raise SessionHeldError(f"session {session_id!r} has a request running; send this one once it has ended")

    @_method("control")
    def hold(self, session_id: str, hold: Hold) -> str | None:
        """Take the session for a request of several calls (``_take``), until ``release_hold`` or
        ``hold.ttl_s`` without ``renew_holds``; returns the session's tenant (``UnknownSessionError``
        where this backend has no such session)."""
        tenant = self.host.tenant_of(session_id)
        self._take(session_id, hold)
        return tenant

    @_method("control")
    def release_hold(self, session_id: str, holder: str) -> None:
        self._holds.release(session_id, holder)

    @_method("control")
    def renew_holds(self, held: dict[str, str], ttl_s: float) -> None:
        self._holds.renew(held, ttl_s)

    @_method("control")
    def open_session(self, session_id: str, policy: SessionPolicy | None = None) -> None:
        with self._call("open_session"):
            self.host.open_session(session_id, policy)

    @_method("calls")
    def append(self, session_id: str, tokens: Sequence[int], request_id: str | None = None) -> int:
        with self._call("append"):
            if len(tokens) < PROGRESS_TOKENS:
                return self.host.append(session_id, tokens, request_id)
            before = self.host.token_count(session_id)
            watcher = watch(lambda: self.host.token_count(session_id) - before, len(tokens),
                            f"backend {self.host.name!r}: session {session_id!r} prefill")
            try:
                length = self.host.append(session_id, tokens, request_id)
            except BaseException:
                watcher.stop()
                raise
            watcher.stop(len(tokens))
            return length

    @_method("calls")
    def append_text(self, session_id: str, text: str, request_id: str | None = None) -> list[int]:
        with self._call("append_text"):
            return self.host.append_text(session_id, text, request_id)

    @_method("calls")
    def generate(self, session_id: str, request: GenerationRequest, request_id: str | None = None,
                 prompt: list[int] | None = None) -> Generation:
        with self._call("generate") as t0:
            answer = self.host.generate(session_id, request, request_id=request_id, prompt=prompt)
            self._answered("generate", t0)
            return answer

    @_method("calls", streaming=True)
    def stream(self, session_id: str, request: GenerationRequest, request_id: str | None = None,
               prompt: list[int] | None = None, messages: list[dict[str, Any]] | None = None, *,
               lease: list[ray.ObjectRef[bytes]] | None = None, chunks: bool = False, ephemeral: bool = False,
               policy: SessionPolicy | None = None, hold: Hold | None = None,
               ) -> Iterator[int | list[int] | Generation]:
        """One object per token (``chunks``: per list of the tokens out when the last was taken,
        ``TokenStream.next_chunk``), then the ``Generation`` (why it ended). Each yield returns once
        the driver took its object (``STREAM_OBJECTS_AHEAD``), and only then does the host's stream
        count its tokens read, so the host's job runs at most ``STREAM_AHEAD`` tokens past the
        driver and is committed once the driver took them all. A stream its consumer leaves keeps
        only the tokens it yielded: the generator closed (by Ray too, when the driver that called
        dies), or the driver gone (``lease``: an object the driver owns; Ray reports its owner's
        death to whoever holds it, checked every ``LEASE_CHECK_S`` while tokens flow). ``prompt``
        (tokens) or ``messages`` (a chat turn): appended first, in the same call. ``ephemeral``: a
        stateless turn, its session (of ``policy``) opened and closed by this call, never journaled.
        ``hold``: the session taken for that request first (``_take``: the request's one call),
        released once the stream has ended whole (a stream left early keeps it: its request still
        trims the session, then releases it)."""
        if hold is not None:
            self._take(session_id, hold)
        with self._call("stream") as t0:
            stream = self.host.stream(session_id, request, request_id, prompt, messages, ephemeral=ephemeral,
                                      policy=policy)
            read: Callable[[], list[int]] = stream.next_chunk if chunks else lambda: [next(stream)]
            yielded = 0
            checked = time.monotonic()
            name, last = self.host.name, t0
            try:
                while True:
                    try:
                        got = read()
                    except StopIteration:
                        break
                    now = time.perf_counter()
                    if yielded:
                        for _ in got:  # a chunk's tokens came over the gap since the last one
                            self.metrics.observe_token_gap(name, (now - last) / len(got))
                    else:
                        self.metrics.observe_first_token(name, "stream", now - t0)
                    last = now
                    yield got if chunks else got[0]
                    yielded += len(got)
                    if lease and time.monotonic() - checked > LEASE_CHECK_S:
                        checked = time.monotonic()
                        if not driver_alive(lease[0]):
                            break
            finally:
                stream.close(keep=yielded)  # a stream left before its end keeps what the driver took
            if stream.generation is not None:
                if hold is not None and stream.generation.finish_reason != "cancelled":  # not left early
                    self._holds.release(session_id, hold.holder)
                yield stream.generation

    @_method("calls")
    def chat(self, session_id: str, messages: list[dict[str, Any]], request: GenerationRequest,
             request_id: str | None = None) -> Generation:
        with self._call("chat") as t0:
            answer = self.host.chat(session_id, messages, request, request_id)
            self._answered("chat", t0)
            return answer

    @_method("calls")
    def append_messages(self, session_id: str, messages: list[dict[str, Any]], request_id: str | None = None) -> int:
        with self._call("append_messages"):
            return self.host.append_messages(session_id, messages, request_id)

    @_method("control")
    def cancel(self, session_id: str, request_id: str | None = None, keep: int | None = None) -> Generation | None:
        return self.host.cancel(session_id, request_id, keep)

    @_method("control")
    def truncate(self, session_id: str, length: int) -> int:
        return self.host.truncate(session_id, length)

    @_method("control")
    def fork(self, source_id: str, new_id: str) -> None:
        self.host.fork(source_id, new_id)

    @_method("control")
    def tokens(self, session_id: str) -> list[int]:
        return self.host.tokens(session_id)

    @_method("control")
    def export(self, session_id: str) -> bytes:
        return self.host.export(session_id)

    @_method("control")
    def restore(self, data: bytes, session_id: str | None = None) -> tuple[str, int]:
        return self.host.restore(data, session_id)

    @_method("control")
    def suspend(self, session_id: str) -> None:
        with self._call("suspend"), self._explicit(session_id, "explicit_suspends", was_live=True):
            self.host.suspend(session_id)

    @_method("control")
    def resume(self, session_id: str, record: SuspendRecord | None = None) -> int:
        with self._call("resume"), self._explicit(session_id, "explicit_resumes", was_live=False):
            return self.host.resume(session_id, record)

    @contextmanager
    def _explicit(self, session_id: str, counter: str, was_live: bool) -> Iterator[None]:
        """Count an explicit suspend (resume) that changes something, under the host's lock so no
        call slips between. A suspend is counted before it parks the session (the counters travel
        in its record), once the refusals it would raise are ruled out; a resume once it is in."""
        ctx = self.host._ctx  # the host counts the forced ones itself; these arrive only here
        with ctx.lock:
            s = ctx.sessions.get(session_id)
            if was_live:
                if s is not None and s.live and ctx.store is not None and not ctx.jobs.pending(session_id):
                    ctx.count(session_id, counter)
                yield
                return
            changes = s is None or not s.live
            yield
            if changes and session_id in ctx.sessions:
                ctx.count(session_id, counter)

    @_method("control")
    def detach(self, session_id: str) -> SuspendRecord:
        with self._call("detach"):
            return self.host.detach(session_id)

    @_method("control")
    def close(self, session_id: str) -> None:
        with self._call("close"):
            self.host.close(session_id)

    @_method("control")
    def pause_for_tools(self, session_id: str) -> None:
        self.host.pause_for_tools(session_id)

    @_method("control")
    def session_stats(self, session_id: str) -> dict[str, Any]:
        return self.host.session_stats(session_id)

    @_method("control")
    def stats(self) -> dict[str, Any]:
        tier = self.tier_decision.as_dict() if self.tier_decision is not None else None
        recall = None if self.recall_costs is None else self.recall_costs.status
        return {**self.host.stats(), "node_id": self.node_id, "kv_types": (self.host.config.type_k,
                self.host.config.type_v), "tier_decision": tier, "recall_costs": recall,
                "calls_in_flight": self._in_flight}

    @_method("control")
    def tokenize(self, text: str, add_bos: bool = True, special: bool = False) -> list[int]:
        return self.host.tokenize(text, add_bos, special)

    @_method("control")
    def detokenize(self, tokens: Sequence[int], special: bool = False) -> str:
        return self.host.detokenize(tokens, special)


if TYPE_CHECKING:
    def _declared(server: BackendServer) -> BackendSurface[Iterator[int | list[int] | Generation], tuple[str, int]]:
        return server  # mypy checks the shell's operations against their declaration


# Ray's stubs do not list concurrency_groups among ray.remote's keywords; Ray accepts it.
BackendActor = ray.remote(  # type: ignore[call-overload]
    concurrency_groups={"calls": CALL_THREADS, "control": CONTROL_THREADS}
)(BackendServer)
