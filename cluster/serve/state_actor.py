"""What the HTTP front shares between its replicas: stored responses, session owners, metrics.

Primitives:
- ``ServeStateActor(namespace)``: one named, detached Ray actor per kvres namespace
  (``state_actor_name()``), restarted by Ray when it dies (a call made meanwhile, or in flight
  at its death, waits for the new process). Its stored responses are written through to Ray's
  GCS key-value store (``RESPONSES_KV_NAMESPACE``) and read back when it starts,
  so they survive its death and every replica's; its session owners (``owners``: a cache of each
  session's tenant) and metrics are memory only. (A request's hold on its session lives on the
  session's backend: ``holds``.)
- ``ServeState(namespace)``: a replica's client of it: ``put_response``, ``get_response``,
  ``delete_response``, ``forget_session`` (each waits for its answer),
  ``owner(key) -> Owner``, ``claim(key, tenant)`` (sent without waiting: calls from one replica
  reach the actor in order),
  ``enter`` / ``record`` (metrics, aggregated in the replica and sent one flush at a time,
  ``metrics.ReplicaMetrics``: no call per request),
  ``metrics_text()``, ``session_counters(session_id)``, ``destroy()`` (kill the actor and drop its stored responses).

A bound turn makes no call to it; metrics reach it one flush at a time. Like kvres's other actors it reports no task events to Ray
(``ray_task_events.actor_task_events``).
"""

from __future__ import annotations

import contextlib
import uuid
from typing import Any

import ray

from ..ray_task_events import actor_task_events
from .metrics import ReplicaMetrics, RequestSample, ServeMetrics
from .owners import Owner, SessionOwners
from .records import ResponseRecord, ResponseRecords

RESPONSES_KV_NAMESPACE = "kvres-serve-responses"


def state_actor_name() -> str:
    return "kvres-serve-state"


def _kv_prefix(namespace: str) -> str:
    return f"{namespace}/"


# max_task_retries: a call sent while Ray restarts it (or in flight at its death) waits for the new
# process and runs there, instead of failing its request (ActorUnavailableError). Run again, a call
# does what it did: a record put again under its id, a metric counted (a deletion that had happened
# finds nothing).
@ray.remote(num_cpus=0, max_restarts=-1, max_task_retries=-1)
class ServeStateActor:
    def __init__(self, namespace: str) -> None:
        from ray.experimental import internal_kv

        self._kv = internal_kv
        self._prefix = _kv_prefix(namespace)
        self.records = ResponseRecords(persist=self._persist)
        keys = internal_kv._internal_kv_list(self._prefix, namespace=RESPONSES_KV_NAMESPACE)
        loaded = []
        for key in keys:
            data = internal_kv._internal_kv_get(key, namespace=RESPONSES_KV_NAMESPACE)
            if data is not None:
                with contextlib.suppress(ValueError, TypeError):
                    loaded.append(ResponseRecord.from_json(data))
        self.records.load(loaded)
        self.owners = SessionOwners()
        self.metrics = ServeMetrics()

    def _persist(self, record_id: str, text: str | None) -> None:
        key = self._prefix + record_id
        if text is None:
            self._kv._internal_kv_del(key, namespace=RESPONSES_KV_NAMESPACE)
        else:
            self._kv._internal_kv_put(key, text, overwrite=True, namespace=RESPONSES_KV_NAMESPACE)

    # -- stored responses --------------------------------------------------------------------
    def put_response(self, record: ResponseRecord) -> list[str]:
        orphans = self.records.put(record)
        for session_id in orphans:  # the replica closes them
            self.owners.drop(session_id)
        return orphans

    def get_response(self, record_id: str) -> ResponseRecord | None:
        return self.records.get(record_id)

    def delete_response(self, record_id: str) -> tuple[ResponseRecord | None, str | None]:
        record, orphan = self.records.delete(record_id)
        if orphan is not None:
            self.owners.drop(orphan)
        return record, orphan

    def forget_session(self, session_id: str) -> list[str]:
        self.metrics.forget_session(session_id)
        self.owners.drop(session_id)
        return self.records.forget_session(session_id)

    def drop_all(self) -> None:
        for rid in self.records.ids():
            self.records.delete(rid)

    # -- owners --------------------------------------------------------------------------------
    def owner(self, key: str) -> Owner:
        return self.owners.get(key)

    def claim(self, key: str, tenant: str | None) -> None:
        self.owners.set(key, tenant)

    # -- metrics -------------------------------------------------------------------------------
    def merge(self, replica: str, delta: ServeMetrics, in_flight: dict[str, int]) -> None:
        self.metrics.merge(replica, delta, in_flight)

    def metrics_text(self) -> str:
        return self.metrics.render()

    def session_counters(self, session_id: str) -> dict[str, int]:
        return self.metrics.session_counters(session_id)


class ServeState:
    def __init__(self, namespace: str) -> None:
        self.namespace = namespace
        self.replica = uuid.uuid4().hex[:8]
        self._handle = ServeStateActor.options(  # type: ignore[attr-defined]
            name=state_actor_name(), namespace=namespace, get_if_exists=True, lifetime="detached",
            **actor_task_events(),
        ).remote(namespace)
        self._metrics = ReplicaMetrics(self._send_metrics)

    def _get(self, ref: Any) -> Any:
        return ray.get(ref)

    def put_response(self, record: ResponseRecord) -> list[str]:
        return list(self._get(self._handle.put_response.remote(record)))

    def get_response(self, record_id: str) -> ResponseRecord | None:
        record: ResponseRecord | None = self._get(self._handle.get_response.remote(record_id))
        return record

    def delete_response(self, record_id: str) -> tuple[ResponseRecord | None, str | None]:
        answer: tuple[ResponseRecord | None, str | None] = self._get(self._handle.delete_response.remote(record_id))
        return answer

    def forget_session(self, session_id: str) -> list[str]:
        return list(self._get(self._handle.forget_session.remote(session_id)))

    def owner(self, key: str) -> Owner:
        owner: Owner = self._get(self._handle.owner.remote(key))
        return owner

    def claim(self, key: str, tenant: str | None) -> None:
        self._handle.claim.remote(key, tenant)

    def enter(self, route: str) -> None:
        self._metrics.enter(route)

    def record(self, sample: RequestSample) -> None:
        self._metrics.record(sample)

    def _send_metrics(self, delta: ServeMetrics, in_flight: dict[str, int]) -> None:
        self._handle.merge.remote(self.replica, delta, in_flight)

    def metrics_text(self) -> str:
        self._metrics.flush()  # sent before the read: calls from one replica reach the actor in order
        return str(self._get(self._handle.metrics_text.remote()))

    def session_counters(self, session_id: str) -> dict[str, int]:
        self._metrics.flush()
        return dict(self._get(self._handle.session_counters.remote(session_id)))

    def destroy(self) -> None:
        with contextlib.suppress(Exception):
            self._get(self._handle.drop_all.remote())
        ray.kill(self._handle)
