"""How often a backend may try to start, and why it could not: one record per backend in Ray's GCS,
which outlives the processes that die starting, read by every driver and by ``kvres status``.

Every kvres actor restarts without limit when it dies (``max_restarts=-1``), which a crash while
serving needs; a backend whose start itself fails would restart for ever. These records bound it.
An engine that raises while the backend is built fails it at once (Ray does not restart an actor
whose constructor raised, and the error would only repeat); a process that dies while starting
(a native abort, a fatal signal) is started again by Ray, at most ``START_ATTEMPTS`` times in a row.

Primitives:
- ``START_ATTEMPTS`` (3): how many starts in a row may die before the backend is failed.
- ``StartAttempts(namespace, backend)``: the record of the backend actor this process serves,
  counted per actor (Ray's actor id: a restart keeps it; a backend created anew counts from zero).
  - ``begin()``: one more attempt. The stderr of the attempt that died before it (``output``) is
    written to this one's log; when ``START_ATTEMPTS`` in a row died the backend is failed, its
    reason the last words of the last one (``engine_output.last_words``), and
    ``BackendStartError`` raised.
  - ``output(path)``: where this attempt's stderr is captured.
  - ``failed(reason, attempts=None) -> BackendStartError``: the backend is marked failed.
  - ``started()``: the record is dropped: a later crash restarts the backend as any other.
- ``start_failure(namespace, backend) -> BackendStartError | None``: the backend failed to start.
- ``start_state(namespace, backend) -> str | None``: what a status row says of a backend whose
  start failed (the error) or is under way (``starting: attempt k of N``); None otherwise.
- ``failed_backends(namespace) -> dict[str, BackendStartError]``.
- ``forget_start(namespace, backend)``, ``forget_starts(namespace)``: drop records (a backend
  created anew, a namespace shut down).
"""

from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path
from typing import Any

import ray
from ray.experimental import internal_kv

from kvres.policy.errors import BackendStartError

from .engine_output import last_words

START_ATTEMPTS = 3
STARTS_KV_NAMESPACE = "kvres-starts"


def _kv(namespace: str) -> str:
    return f"{STARTS_KV_NAMESPACE}/{namespace}"


def _load(namespace: str, backend: str) -> dict[str, Any] | None:
    data = internal_kv._internal_kv_get(backend, namespace=_kv(namespace))
    if data is None:
        return None
    try:
        record: dict[str, Any] = json.loads(data)
    except ValueError:
        return None
    return record


def _failure(backend: str, record: dict[str, Any] | None) -> BackendStartError | None:
    if record is None or not record.get("failed"):
        return None
    return BackendStartError(backend, str(record.get("reason", "")), int(record.get("attempts", 1)))


class StartAttempts:
    def __init__(self, namespace: str, backend: str) -> None:
        self.namespace = namespace
        self.backend = backend
        context = ray.get_runtime_context()
        self.actor_id = str(context.get_actor_id())
        self.node_id = str(context.get_node_id())
        self._record: dict[str, Any] = {"actor": self.actor_id, "attempts": 0}

    def _save(self) -> None:
        internal_kv._internal_kv_put(self.backend, json.dumps(self._record), overwrite=True,
                                     namespace=_kv(self.namespace))

    def begin(self) -> None:
        found = _load(self.namespace, self.backend)
        if found is not None and found.get("actor") == self.actor_id:  # else another actor's: counted anew
            self._record = found
            failure = _failure(self.backend, found)
            if failure is not None:
                raise failure
        attempts = int(self._record.get("attempts", 0))
        if attempts:
            words = self._last_attempt_said(attempts)
            self._record["words"] = words
            if attempts >= START_ATTEMPTS:
                raise self.failed("its process died while starting: " + (
                    words or "it wrote nothing here (its node's worker log may say more: `ray logs`)"))
        self._record.update(attempts=attempts + 1, node=self.node_id, output="")
        self._save()

    def _last_attempt_said(self, attempts: int) -> str:
        """The last words of the attempt that died, its whole output written to this one's log."""
        path = Path(str(self._record.get("output") or ""))
        if not self._record.get("output") or self._record.get("node") != self.node_id or not path.is_file():
            return ""
        with contextlib.suppress(OSError):
            said = path.read_text(errors="replace")
            path.unlink()
            sys.stderr.write(f"kvres: backend {self.backend!r}: start attempt {attempts} of {START_ATTEMPTS} died; "
                             f"what it wrote:\n{said}\n")
            sys.stderr.flush()
            return last_words(said)
        return ""

    def output(self, path: Path) -> None:
        self._record["output"] = str(path)
        self._save()

    def failed(self, reason: str, attempts: int | None = None) -> BackendStartError:
        count = int(self._record.get("attempts", 1)) if attempts is None else attempts
        self._record.update(failed=True, reason=reason, attempts=count)
        self._save()
        return BackendStartError(self.backend, reason, count)

    def started(self) -> None:
        forget_start(self.namespace, self.backend)


def start_failure(namespace: str, backend: str) -> BackendStartError | None:
    return _failure(backend, _load(namespace, backend))


def start_state(namespace: str, backend: str) -> str | None:
    record = _load(namespace, backend)
    failure = _failure(backend, record)
    if failure is not None:
        return str(failure)
    if record is None or not record.get("attempts"):
        return None
    return f"starting: attempt {record['attempts']} of {START_ATTEMPTS}"


def _names(namespace: str) -> list[str]:
    return [k.decode() if isinstance(k, bytes) else str(k)
            for k in internal_kv._internal_kv_list("", namespace=_kv(namespace))]


def failed_backends(namespace: str) -> dict[str, BackendStartError]:
    found = {name: start_failure(namespace, name) for name in _names(namespace)}
    return {name: failure for name, failure in found.items() if failure is not None}


def forget_start(namespace: str, backend: str) -> None:
    internal_kv._internal_kv_del(backend, namespace=_kv(namespace))


def forget_starts(namespace: str) -> None:
    for name in _names(namespace):
        forget_start(namespace, name)
