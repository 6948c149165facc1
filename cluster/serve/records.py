"""Stored responses (the Responses API's ``store=true``): each names a point in a kvres session.

Primitives:
- ``ResponseRecord``: ``id``, ``session_id``, ``length`` (the session's log length once the
  response was written: the point ``previous_response_id`` continues from), ``conversation`` (the
  messages through this response, instructions left out: they apply to one response only),
  ``input_items`` (this request's input, for ``GET /v1/responses/{id}/input_items``),
  ``response`` (the Response object as it was answered), ``created_at``, ``tenant`` (the label of
  the API key that made it: only that tenant's keys read, continue or delete it). ``to_json`` / ``from_json``.
- ``ResponseRecords(max_records=100_000)``: ``put(record) -> [session ids no record names any
  more]`` (the oldest records make room past ``max_records``), ``get(id)``, ``delete(id) ->
  (record, session id no record names any more or None)``, ``forget_session(session_id) -> [ids]``,
  ``ids()``. Every change goes through ``persist(id, json or None)`` when one is given, so a store
  can be rebuilt from what it wrote (``load``).
"""

from __future__ import annotations

import json
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class ResponseRecord:
    id: str
    session_id: str
    length: int
    conversation: list[dict[str, Any]]
    input_items: list[dict[str, Any]] = field(default_factory=list)
    response: dict[str, Any] = field(default_factory=dict)
    created_at: float = 0.0
    tenant: str | None = None

    def to_json(self) -> str:
        return json.dumps(asdict(self), ensure_ascii=False)

    @classmethod
    def from_json(cls, text: str | bytes) -> ResponseRecord:
        return cls(**json.loads(text))


Persist = Callable[[str, str | None], None]


class ResponseRecords:
    def __init__(self, max_records: int = 100_000, persist: Persist | None = None) -> None:
        if max_records < 1:
            raise ValueError(f"max_records must be >= 1, got {max_records}")
        self.max_records = max_records
        self._persist = persist
        self._records: OrderedDict[str, ResponseRecord] = OrderedDict()
        self._per_session: Counter[str] = Counter()

    def load(self, records: Iterable[ResponseRecord]) -> None:
        """Records written before (oldest first), without persisting them again."""
        for r in sorted(records, key=lambda r: r.created_at):
            self._add(r)

    def _add(self, record: ResponseRecord) -> None:
        old = self._records.pop(record.id, None)
        if old is not None:
            self._per_session[old.session_id] -= 1
        self._records[record.id] = record
        self._per_session[record.session_id] += 1

    def _drop(self, record_id: str) -> str | None:
        record = self._records.pop(record_id)
        if self._persist is not None:
            self._persist(record_id, None)
        self._per_session[record.session_id] -= 1
        if self._per_session[record.session_id] <= 0:
            del self._per_session[record.session_id]
            return record.session_id
        return None

    def put(self, record: ResponseRecord) -> list[str]:
        self._add(record)
        if self._persist is not None:
            self._persist(record.id, record.to_json())
        orphans = []
        while len(self._records) > self.max_records:
            orphan = self._drop(next(iter(self._records)))
            if orphan is not None:
                orphans.append(orphan)
        return orphans

    def get(self, record_id: str) -> ResponseRecord | None:
        return self._records.get(record_id)

    def delete(self, record_id: str) -> tuple[ResponseRecord | None, str | None]:
        record = self._records.get(record_id)
        if record is None:
            return None, None
        return record, self._drop(record_id)

    def forget_session(self, session_id: str) -> list[str]:
        ids = [rid for rid, r in self._records.items() if r.session_id == session_id]
        for rid in ids:
            self._drop(rid)
        return ids

    def ids(self) -> list[str]:
        return list(self._records)

    def __len__(self) -> int:
        return len(self._records)
