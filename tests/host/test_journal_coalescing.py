"""A record of a change that adds no token (a suspend, a resume) waits ``later_s`` for a newer
record of its session to replace it: a session parked and brought back for its next turn is written
once, with that turn's commit. On the real engine, without Ray: the journal is a ``MemoryJournal``
that says it is remote (writes behind the step loop, as Ray's GCS) and counts its writes."""

from __future__ import annotations

import threading
import time
from collections import Counter
from pathlib import Path

from kvres.actors.backend_setup.engine_registry import make_executor
from kvres.actors.config import BackendConfig, SessionPolicy
from kvres.actors.generation import GenerationRequest
from kvres.actors.host.backend import BackendHost
from kvres.actors.host.journal import MemoryJournal, SessionRecord, WriteBehindJournal
from kvres.actors.ray_actors.coldstore_actor import ColdStoreServer
from kvres.testing import LocalStorePort

from ..conftest import shared_model_path


class CountingJournal(MemoryJournal):
    remote = True

    def __init__(self) -> None:
        super().__init__()
        self.writes: Counter[str] = Counter()
        self.lock = threading.Lock()

    def save(self, record: SessionRecord) -> None:
        with self.lock:
            self.writes[record.session_id] += 1
        super().save(record)


def _record(session_id: str, tokens: list[int]) -> SessionRecord:
    return SessionRecord(session_id=session_id, token_log=tokens, resident_ranges=[], blocks=[], cold=[],
                         policy=SessionPolicy(), last_logits=None, counters={}, fingerprint="fp")


def test_turns_that_park_and_resume_write_one_record_each(tmp_path: Path) -> None:
    model = shared_model_path()
    cfg = BackendConfig(name="coalesce", model_path=model, n_ctx=512, n_seq_max=1, kv_budget_tokens=512, n_threads=1)
    inner = CountingJournal()
    store = LocalStorePort("n", {"n": ColdStoreServer(64 << 20, tmp_path / "cold", 256 << 20)})
    host = BackendHost(cfg, make_executor(cfg, model), store=store, journal=inner)
    host._ctx.journal = journal = WriteBehindJournal(inner, later_s=60.0)  # parks for room wait for the next turn
    try:
        for sid in ("a", "b"):
            host.open_session(sid)
        opened = sum(inner.writes.values())
        turns = 0
        for _ in range(3):
            for sid in ("a", "b"):  # one slot: each turn parks the other session and brings its own back
                host.append(sid, [5, 6, 7])
                host.generate(sid, GenerationRequest(max_tokens=2, ignore_eos=True))
                turns += 2
        suspends = host.stats()["sessions"]
        assert sum(s["state"] == "suspended" for s in suspends.values()) == 1
        assert sum(inner.writes.values()) - opened == turns  # the commits only: each park and resume replaced
        parked = next(sid for sid, s in suspends.items() if s["state"] == "suspended")
        assert journal.load(parked) is not None and journal.load(parked).state == "suspended"  # type: ignore[union-attr]
        assert inner.load(parked).state == "live"  # type: ignore[union-attr]  (its suspend not yet written)
        journal.flush()
        assert inner.load(parked).state == "suspended"  # type: ignore[union-attr]
        assert inner.load(parked).token_log == host.tokens(parked)  # type: ignore[union-attr]
    finally:
        host.shutdown()


def test_a_record_left_alone_is_written_within_later_s() -> None:
    inner = CountingJournal()
    journal = WriteBehindJournal(inner, later_s=0.2)
    journal.save_later(_record("s", [1]), replaceable=True)
    assert inner.writes["s"] == 0
    deadline = time.monotonic() + 10
    while inner.writes["s"] == 0 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert inner.writes["s"] == 1 and inner.load("s").token_log == [1]  # type: ignore[union-attr]


def test_a_session_changing_all_the_time_is_still_written() -> None:
    """A newer ``save_later`` replaces the older but keeps its due time: no write put off forever."""
    inner = CountingJournal()
    journal = WriteBehindJournal(inner, later_s=0.2)
    started = time.monotonic()
    tokens = [1]
    while time.monotonic() - started < 1.0:
        tokens = [*tokens, 2]
        journal.save_later(_record("s", tokens), replaceable=True)
        time.sleep(0.01)
    assert 2 <= inner.writes["s"] <= 8
    journal.flush()
    assert inner.load("s").token_log == tokens  # type: ignore[union-attr]


def test_a_commit_replacing_a_pending_record_is_written_at_once_and_told() -> None:
    inner = CountingJournal()
    journal = WriteBehindJournal(inner, later_s=60.0)
    journal.save_later(_record("s", [1]), replaceable=True)
    told = threading.Event()
    errors: list[BaseException | None] = []

    def written(error: BaseException | None) -> None:
        errors.append(error)
        told.set()

    journal.save_soon(_record("s", [1, 2]), written)
    assert told.wait(10) and errors == [None]
    assert inner.writes["s"] == 1 and inner.load("s").token_log == [1, 2]  # type: ignore[union-attr]
    journal.flush()
    assert inner.writes["s"] == 1  # nothing of it left pending


def test_a_record_not_replaceable_is_written_at_once() -> None:
    """A suspend its owner asked for (not one for room) is written without waiting for a newer record."""
    inner = CountingJournal()
    journal = WriteBehindJournal(inner, later_s=60.0)
    journal.save_later(_record("s", [1]))
    deadline = time.monotonic() + 10
    while inner.writes["s"] == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert inner.writes["s"] == 1
