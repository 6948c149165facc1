"""What a session owns, kept outside the process that serves it.

Primitives:
- ``SessionRecord``: a session as it was at its last commit: token log, policy, last logits,
  resident ranges, block references (the parked KV of a suspended session, the spilled KV of a
  live one), counters, the backend that serves it, the last request it answered (id and result,
  so a retried call is answered, not run twice) and whether recomputing its KV from the log is
  exact. A suspend hands one over to whoever resumes the session.
- ``Journal``: ``save(record)``, ``load(session_id)``, ``delete(session_id)``, ``session_ids()``.
  ``MemoryJournal`` keeps records in this process (a backend without Ray);
  ``kvres.actors.ray_actors.ray_journal.RayJournal`` keeps them in Ray's GCS key-value store.
- ``WriteBehindJournal(journal, later_s=LATER_WRITE_S)``: the same journal plus
  ``save_later(record, replaceable=False)``, written by a background thread (the newest record
  per session: a later ``save``, ``save_soon`` or ``delete`` of the session supersedes it;
  ``replaceable``: not before ``later_s``, so a session parked for room and resumed for its next
  turn is written once, with that turn). For changes that add no token (a suspend, a resume, an
  eviction): if the process dies before the write, the older record still holds every committed
  token. ``save_soon(record, written)``: written at
  once, and ``written(error)`` told once the record (or a newer one of the session) is written:
  where the journal is ``remote`` (Ray's GCS) a call's commit is written there, off the step
  loop, and the call answered once it is (``Durability.commit_call``). ``flush()`` writes what is
  pending now.
- ``Directory``: the planner's session -> backend map kept the same way: ``MemoryDirectory``
  (``ray_journal.RayDirectory`` in the GCS).

A backend commits a session's record when a call of it completes (before the call returns), when
it is suspended or resumed, and when it is opened; a restarted backend rebuilds a session from its
record on first use: parked blocks are imported, the rest recomputed from the token log.
"""

from __future__ import annotations

import logging
import pickle
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from kvres.actors.config import SessionPolicy
from kvres.coldstore import BlockKey
from kvres.policy import Range

from .store_ports import ColdRef

log = logging.getLogger("kvres.journal")


@dataclass
class SessionRecord:
    session_id: str
    token_log: list[int]
    resident_ranges: list[Range]
    blocks: list[ColdRef]  # parked by a suspend: the resident ranges' KV
    cold: list[ColdRef]  # spilled by eviction
    policy: SessionPolicy
    last_logits: npt.NDArray[np.float32] | None
    counters: dict[str, int]
    fingerprint: str
    backend: str = ""
    state: Literal["live", "suspended"] = "suspended"
    request_id: str | None = None  # the last call this record commits
    result: Any = None  # what that call returned
    exact: bool = True  # recomputing the resident ranges from the log gives the KV they hold
    generation: int = 0  # commits so far (a record never goes back to an older one)
    notes: list[str] = field(default_factory=list)

    # A spilling session holds hundreds of refs; pickled one object each they cost more than the
    # rest of the record (and a commit writes the record before its call answers): they travel as
    # columns instead.
    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["blocks"], state["cold"] = pack_refs(self.blocks), pack_refs(self.cold)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        state = dict(state)
        for name in ("blocks", "cold"):
            if not isinstance(state[name], list):
                state[name] = unpack_refs(state[name])
        self.__dict__.update(state)


PackedRefs = tuple[tuple[str, ...], npt.NDArray[np.signedinteger[Any]]]


def pack_refs(refs: list[ColdRef]) -> PackedRefs:
    """``refs`` as (the distinct strings, one row per ref: store, session, fingerprint as indices
    into them, then token start, end and payload bytes)."""
    names: dict[str, int] = {}
    index = names.setdefault
    flat = [v for ref in refs for v in (
        index(ref.store, len(names)), index(ref.key.session_id, len(names)), index(ref.key.fingerprint, len(names)),
        ref.key.token_range.start, ref.key.token_range.end, ref.nbytes)]
    rows = np.array(flat, dtype=np.int64).reshape(-1, 6)
    return tuple(names), rows.astype(np.int32) if rows.size and rows.max() < 2**31 else rows


def unpack_refs(packed: PackedRefs) -> list[ColdRef]:
    names, rows = packed
    return [ColdRef(names[store], BlockKey(names[sid], Range(start, end), names[fp]), nbytes)
            for store, sid, fp, start, end, nbytes in rows.tolist()]


def encode_record(record: SessionRecord) -> bytes:
    return pickle.dumps(record, protocol=5)


def decode_record(data: bytes) -> SessionRecord:
    record = pickle.loads(data)
    if not isinstance(record, SessionRecord):
        raise TypeError(f"journal entry holds a {type(record).__name__}, not a SessionRecord")
    return record


class Journal(ABC):
    remote = False  # a write is a round trip to another process (then a call's answer waits for it off the step loop)

    @abstractmethod
    def save(self, record: SessionRecord) -> None: ...

    @abstractmethod
    def load(self, session_id: str) -> SessionRecord | None: ...

    @abstractmethod
    def delete(self, session_id: str) -> None: ...

    @abstractmethod
    def session_ids(self) -> list[str]: ...


class MemoryJournal(Journal):
    def __init__(self) -> None:
        self._records: dict[str, bytes] = {}

    def save(self, record: SessionRecord) -> None:
        self._records[record.session_id] = encode_record(record)

    def load(self, session_id: str) -> SessionRecord | None:
        data = self._records.get(session_id)
        return None if data is None else decode_record(data)

    def delete(self, session_id: str) -> None:
        self._records.pop(session_id, None)

    def session_ids(self) -> list[str]:
        return list(self._records)


Written = Callable[[BaseException | None], None]  # told once a record is written (None) or failed (the error)


LATER_WRITE_S = 2.0  # how long a replaceable ``save_later`` record waits for a newer record of its session


@dataclass
class _Pending:
    record: SessionRecord
    waiting: list[Written]
    due: float  # time.monotonic() from when it is written


class WriteBehindJournal(Journal):
    def __init__(self, journal: Journal, later_s: float = LATER_WRITE_S) -> None:
        self._journal = journal
        self._later_s = later_s
        self._pending: dict[str, _Pending] = {}
        self._write_lock = threading.Lock()  # one write at a time: an older record never lands last
        self._wake = threading.Condition()
        self._thread: threading.Thread | None = None

    @property
    def remote(self) -> bool:  # type: ignore[override]
        return self._journal.remote

    def save(self, record: SessionRecord) -> None:
        with self._write_lock:
            with self._wake:
                pending = self._pending.pop(record.session_id, None)
            waiting = pending.waiting if pending is not None else []
            try:
                self._journal.save(record)
            except BaseException as exc:
                _tell(waiting, exc)
                raise
        _tell(waiting, None)  # the newer record holds what theirs did

    def save_later(self, record: SessionRecord, replaceable: bool = False) -> None:
        """Written by the writer thread (a suspend, a resume, an eviction: no token added);
        ``replaceable`` (a session parked for room, or brought back for a call): not before
        ``later_s``, unless a newer record of the session replaces it first, so a session parked
        and resumed for its next turn is written once, with that turn's commit."""
        self._queue(record, None, self._later_s if replaceable else 0.0)

    def save_soon(self, record: SessionRecord, written: Written) -> None:
        """Written at once by the writer thread (ahead of ``save_later``'s not yet due), and
        ``written`` told once the record (or a newer one of the session) is written, or with the
        error where it could not be."""
        self._queue(record, written, 0.0)

    def _queue(self, record: SessionRecord, written: Written | None, wait_s: float) -> None:
        now = time.monotonic()
        with self._wake:
            older = self._pending.pop(record.session_id, None)
            due = now + wait_s
            if older is not None:  # replaced, never later than the older was due (a session changing often is still written)
                due = min(due, older.due)
            self._pending[record.session_id] = _Pending(
                record, [*(older.waiting if older else []), *([written] if written else [])], due)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._write_loop, name="kvres-journal", daemon=True)
                self._thread.start()
            self._wake.notify()

    def load(self, session_id: str) -> SessionRecord | None:
        with self._wake:
            pending = self._pending.get(session_id)
        return pending.record if pending is not None else self._journal.load(session_id)

    def delete(self, session_id: str) -> None:
        with self._write_lock:
            with self._wake:
                pending = self._pending.pop(session_id, None)
            self._journal.delete(session_id)
        _tell(pending.waiting if pending is not None else [], None)  # the session is gone: nothing of it is left to write

    def session_ids(self) -> list[str]:
        with self._wake:
            pending = set(self._pending)
        return sorted(pending | set(self._journal.session_ids()))

    def flush(self) -> None:
        """Write everything pending now (in the caller's thread), due or not; a write that fails is
        raised (its waiters told) after the rest are written."""
        self._write_due(None)

    def _write_due(self, now: float | None) -> None:
        """Write the records due by ``now`` (every one when None), the earliest due first."""
        failed: BaseException | None = None
        while True:
            with self._write_lock:
                with self._wake:
                    due = [(p.due, sid) for sid, p in self._pending.items() if now is None or p.due <= now]
                    if not due:
                        break
                    session_id = min(due)[1]
                    pending = self._pending.pop(session_id)
                try:
                    self._journal.save(pending.record)
                    error: BaseException | None = None
                except Exception as exc:
                    error = failed = exc
            _tell(pending.waiting, error)
        if failed is not None:
            raise failed

    def _write_loop(self) -> None:
        while True:
            with self._wake:
                while True:
                    now = time.monotonic()
                    first = min((p.due for p in self._pending.values()), default=None)
                    if first is not None and first <= now:
                        break
                    self._wake.wait(None if first is None else first - now)
            try:
                self._write_due(now)
            except Exception:
                log.exception("a write-behind journal write failed; the session's older record stands")
                time.sleep(0.5)


def _tell(waiting: list[Written], error: BaseException | None) -> None:
    for written in waiting:
        try:
            written(error)
        except Exception:  # one waiter's failure must not keep the others waiting
            log.exception("a journal write's waiter failed")


class Directory(ABC):
    @abstractmethod
    def put(self, session_id: str, backend: str) -> None: ...

    @abstractmethod
    def delete(self, session_id: str) -> None: ...

    @abstractmethod
    def items(self) -> dict[str, str]: ...


class MemoryDirectory(Directory):
    def __init__(self) -> None:
        self._map: dict[str, str] = {}

    def put(self, session_id: str, backend: str) -> None:
        self._map[session_id] = backend

    def delete(self, session_id: str) -> None:
        self._map.pop(session_id, None)

    def items(self) -> dict[str, str]:
        return dict(self._map)
