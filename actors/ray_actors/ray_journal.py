"""What kvres keeps in Ray's GCS key-value store, which outlives every kvres actor and driver (it
ends with the cluster): the sessions' journal and the planner's directory.

Primitives:
- ``RayJournal(namespace)``: a ``kvres.actors.host.journal.Journal`` of ``SessionRecord``s, one GCS
  namespace per kvres namespace; ``clear()`` forgets every record.
- ``RayDirectory(namespace)``: the planner's session -> backend map (a ``Directory``); ``clear()``.
"""

from __future__ import annotations

from ray.experimental import internal_kv

from kvres.actors.host.journal import Directory, Journal, SessionRecord, decode_record, encode_record

JOURNAL_KV_NAMESPACE = "kvres-journal"
DIRECTORY_KV_NAMESPACE = "kvres-directory"


class _GcsTable:
    """String keys to bytes in one namespace of Ray's GCS key-value store (needs a connected worker)."""

    def __init__(self, namespace: str) -> None:
        self.namespace = namespace

    def put(self, key: str, value: bytes) -> None:
        internal_kv._internal_kv_put(key, value, overwrite=True, namespace=self.namespace)

    def get(self, key: str) -> bytes | None:
        value = internal_kv._internal_kv_get(key, namespace=self.namespace)
        return None if value is None else bytes(value)

    def delete(self, key: str) -> None:
        internal_kv._internal_kv_del(key, namespace=self.namespace)

    def names(self) -> list[str]:
        return [k.decode() if isinstance(k, bytes) else str(k)
                for k in internal_kv._internal_kv_list("", namespace=self.namespace)]


class RayJournal(Journal):
    remote = True

    def __init__(self, namespace: str) -> None:
        self._table = _GcsTable(f"{JOURNAL_KV_NAMESPACE}/{namespace}")

    def save(self, record: SessionRecord) -> None:
        self._table.put(record.session_id, encode_record(record))

    def load(self, session_id: str) -> SessionRecord | None:
        data = self._table.get(session_id)
        return None if data is None else decode_record(data)

    def delete(self, session_id: str) -> None:
        self._table.delete(session_id)

    def session_ids(self) -> list[str]:
        return self._table.names()

    def clear(self) -> None:
        for key in self._table.names():
            self._table.delete(key)


class RayDirectory(Directory):
    def __init__(self, namespace: str) -> None:
        self._table = _GcsTable(f"{DIRECTORY_KV_NAMESPACE}/{namespace}")

    def put(self, session_id: str, backend: str) -> None:
        self._table.put(session_id, backend.encode())

    def delete(self, session_id: str) -> None:
        self._table.delete(session_id)

    def items(self) -> dict[str, str]:
        out: dict[str, str] = {}
        for key in self._table.names():
            value = self._table.get(key)
            if value is not None:
                out[key] = value.decode()
        return out

    def clear(self) -> None:
        for key in self._table.names():
            self._table.delete(key)
