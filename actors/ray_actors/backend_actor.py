"""The backend as a Ray actor: a thin shell around ``BackendHost``.

Primitives:
- ``BackendServer(config, namespace)``: builds the executor (``kvres.actors.engines.registry``),
  finds this node's cold store by name, starts measuring its recall costs in the background where
  its engine takes them (``kvres.actors.sizing.recall_costs.BackgroundRecallCosts``: with its own
  threads and device, on the disk folder of this node's cold store; ``stats()["recall_costs"]``
  says how far that got), freezes the heap it started with (``heap.freeze_startup_heap``), and
  forwards:
  ``open_session``, ``append``, ``append_text``, ``generate``, ``stream`` (a Ray streaming
  generator: one object per token), ``suspend``, ``resume``, ``detach``, ``close``,
  ``session_stats``, ``stats``, ``tokenize``, ``detokenize``.
- ``BackendActor``: the Ray actor class, a threaded actor with two concurrency groups: "calls"
  (appends and generations of up to ``CALL_THREADS`` sessions at once, batched together by the
  host's step loop) and "control" (stats, suspend, resume, close, ...), so a control call never
  queues behind running generations; ``backend_actor_name(name)``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import ray

from kvres.actors.cluster_secrets import cluster_secret, coldstore_secret_name
from kvres.actors.config import BackendConfig, SessionPolicy
from kvres.actors.default_model import default_model_path
from kvres.actors.engines.registry import engine_spec, make_executor, resolve_kv_tier
from kvres.actors.generation import Generation, GenerationRequest
from kvres.actors.host.backend import BackendHost, SuspendRecord
from kvres.actors.host.journal import RayJournal
from kvres.actors.host.store_ports import RayStorePort, cold_store_name
from kvres.actors.metrics import RayMetrics
from kvres.actors.model_files import model_id
from kvres.actors.sizing.device_placement import assigned_gpu_ids, placement_for
from kvres.actors.sizing.recall_costs import BackgroundRecallCosts
from kvres.coldstore import new_secret

from .heap import freeze_startup_heap
from .load_reports import LoadReporter

CALL_THREADS = 256
LEASE_CHECK_S = 0.25  # how often a stream asks whether its driver is still there


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


def backend_actor_name(name: str) -> str:
    return f"kvres-backend-{name}"


def store_disk_folder(store_name: str, namespace: str) -> str | None:
    """The folder the node's cold store keeps its disk tiers in (the configured ``disk_dir``, or
    the default under the user's cache), None when it has no disk tier."""
    handle = ray.get_actor(store_name, namespace=namespace)
    folder: Any = ray.get(handle.disk_folder.remote(), timeout=STORE_ANSWER_S)
    return None if folder is None else str(Path(folder).parent)


class BackendServer:
    def __init__(self, config: BackendConfig, namespace: str) -> None:
        self.node_id = ray.get_runtime_context().get_node_id()
        model = config.model_path or default_model_path()
        spec = engine_spec(config.engine)
        placement = placement_for(config, assigned_gpu_ids())
        config, self.tier_decision = resolve_kv_tier(config, model, placement=placement)
        store_name = cold_store_name(self.node_id)
        store = RayStorePort(store_name, namespace)
        self._reports = LoadReporter(config, str(model), self.node_id, namespace)
        executor = make_executor(config, model, placement)
        self.recall_costs = None if spec.recall_probe is None else BackgroundRecallCosts(
            model, spec.recall_probe(executor, placement),
            disk_folder=lambda: store_disk_folder(store_name, namespace))
        self.host = BackendHost(
            config,
            executor,
            store=store,
            metrics=RayMetrics(),
            recall_costs=self.recall_costs,
            on_change=lambda: self._reports.changed(self.host),
            journal=RayJournal(namespace),
            file_secret=cluster_secret(coldstore_secret_name(namespace), new_secret),
            model_id=model_id(model),
        )
        self._reports.changed(self.host)
        if self.recall_costs is not None:  # off the call path: a resume never waits for a probe
            self.recall_costs.start()
        freeze_startup_heap()

    def __repr__(self) -> str:
        """Live state for Ray's dashboard (its Repr column): the host's counters, never the engine."""
        host = self.__dict__.get("host")
        if host is None:
            return "BackendServer(starting)"
        s = host.stats()
        live = sum(1 for v in s["sessions"].values() if v["state"] == "live")
        return (f"BackendServer({s['backend']}: {s['engine']} {s['model'].rsplit('/', 1)[-1]}, "
                f"{live} live / {len(s['sessions']) - live} suspended sessions, "
                f"{s['resident_tokens']}/{s['kv_budget_tokens']} tokens resident)")

    @ray.method(concurrency_group="control")
    def ping(self) -> str:
        return self.node_id

    @ray.method(concurrency_group="control")
    def pid(self) -> int:
        """The worker process serving this actor (what an operator or a fault test signals)."""
        return os.getpid()

    @ray.method(concurrency_group="control")
    def open_session(self, session_id: str, policy: SessionPolicy | None = None) -> None:
        from kvres.actors.sizing.tier_policy import session_policy_for_tier

        # where T* chose to spill, a session with no eviction policy keeps a resident window and
        # parks the rest in the cold store (its stats show the policy it runs with)
        policy = session_policy_for_tier(self.tier_decision, policy, self.host.config.kv_budget_tokens)
        self.host.open_session(session_id, policy)

    def _policy_here(self, record: SuspendRecord) -> SuspendRecord:
        """A session that left nothing for kvres to evict (kind "none", spill allowed) runs here as
        it would have been opened here: on a backend whose KV tier spills, as a spilling session
        bounded by its resident budget (``session_policy_for_tier``)."""
        from dataclasses import replace

        from kvres.actors.sizing.tier_policy import session_policy_for_tier

        policy = session_policy_for_tier(self.tier_decision, record.policy, self.host.config.kv_budget_tokens)
        return record if policy is record.policy else replace(record, policy=policy)

    @ray.method(concurrency_group="calls")
    def append(self, session_id: str, tokens: Sequence[int], request_id: str | None = None) -> int:
        return self.host.append(session_id, tokens, request_id)

    @ray.method(concurrency_group="calls")
    def append_text(self, session_id: str, text: str, request_id: str | None = None) -> list[int]:
        return self.host.append_text(session_id, text, request_id)

    @ray.method(concurrency_group="calls")
    def generate(self, session_id: str, request: GenerationRequest, request_id: str | None = None) -> Generation:
        return self.host.generate(session_id, request, request_id=request_id)

    @ray.method(num_returns="streaming", concurrency_group="calls")
    def stream(self, session_id: str, request: GenerationRequest, request_id: str | None = None,
               lease: list[ray.ObjectRef[bytes]] | None = None) -> Iterator[int | Generation]:
        """One object per token, then the ``Generation`` (why it ended). A stream its consumer
        leaves keeps only the tokens it yielded: the generator closed, or the driver that called
        gone (``lease``: an object the driver owns; Ray reports its owner's death to whoever
        holds it, checked every ``LEASE_CHECK_S`` while tokens flow)."""
        stream = self.host.stream(session_id, request, request_id=request_id)
        yielded = 0
        checked = time.monotonic()
        try:
            for token in stream:
                yield token
                yielded += 1
                if lease and time.monotonic() - checked > LEASE_CHECK_S:
                    checked = time.monotonic()
                    if not driver_alive(lease[0]):
                        break
        finally:
            if stream.generation is None and not stream.job.done:
                self.host.cancel(session_id, stream.job.request_id, yielded)
        if stream.generation is not None:
            yield stream.generation

    @ray.method(concurrency_group="calls")
    def chat(self, session_id: str, messages: list[dict[str, Any]], request: GenerationRequest,
             request_id: str | None = None) -> Generation:
        return self.host.chat(session_id, messages, request, request_id)

    @ray.method(concurrency_group="calls")
    def append_messages(self, session_id: str, messages: list[dict[str, Any]], request_id: str | None = None) -> int:
        return self.host.append_messages(session_id, messages, request_id)

    @ray.method(concurrency_group="control")
    def cancel(self, session_id: str, request_id: str | None = None, keep: int | None = None) -> Generation | None:
        return self.host.cancel(session_id, request_id, keep)

    @ray.method(concurrency_group="control")
    def truncate(self, session_id: str, length: int) -> int:
        return self.host.truncate(session_id, length)

    @ray.method(concurrency_group="control")
    def fork(self, source_id: str, new_id: str) -> None:
        self.host.fork(source_id, new_id)

    @ray.method(concurrency_group="control")
    def tokens(self, session_id: str) -> list[int]:
        return self.host.tokens(session_id)

    @ray.method(concurrency_group="control")
    def export(self, session_id: str) -> bytes:
        return self.host.export(session_id)

    @ray.method(concurrency_group="control")
    def restore(self, data: bytes, session_id: str | None = None) -> tuple[str, int]:
        return self.host.restore(data, session_id)

    @ray.method(concurrency_group="control")
    def suspend(self, session_id: str) -> None:
        self.host.suspend(session_id)

    @ray.method(concurrency_group="control")
    def resume(self, session_id: str, record: SuspendRecord | None = None) -> int:
        if record is not None:  # handed over by another backend: runs with the policy this one gives it
            record = self._policy_here(record)
        return self.host.resume(session_id, record)

    @ray.method(concurrency_group="control")
    def detach(self, session_id: str) -> SuspendRecord:
        return self.host.detach(session_id)

    @ray.method(concurrency_group="control")
    def close(self, session_id: str) -> None:
        self.host.close(session_id)

    @ray.method(concurrency_group="control")
    def session_stats(self, session_id: str) -> dict[str, Any]:
        return self.host.session_stats(session_id)

    @ray.method(concurrency_group="control")
    def stats(self) -> dict[str, Any]:
        tier = self.tier_decision.as_dict() if self.tier_decision is not None else None
        recall = None if self.recall_costs is None else self.recall_costs.status
        return {**self.host.stats(), "node_id": self.node_id, "kv_types": (self.host.config.type_k,
                self.host.config.type_v), "tier_decision": tier, "recall_costs": recall}

    @ray.method(concurrency_group="control")
    def tokenize(self, text: str, add_bos: bool = True, special: bool = False) -> list[int]:
        return self.host.executor.tokenize(text, add_bos, special)

    @ray.method(concurrency_group="control")
    def detokenize(self, tokens: Sequence[int], special: bool = False) -> str:
        return self.host.executor.detokenize(tokens, special)


# Ray's stubs do not list concurrency_groups among ray.remote's keywords; Ray accepts it.
BackendActor = ray.remote(  # type: ignore[call-overload]
    concurrency_groups={"calls": CALL_THREADS, "control": CONTROL_THREADS}
)(BackendServer)
