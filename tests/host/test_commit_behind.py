"""Where the journal is another process's (Ray's GCS), a call's record is written behind the step
loop: the other sessions decode while it is written, and the call is answered only once it is (a
write that fails fails the call, its session back to its last record). On the real engine, without
Ray: the journal here is a ``MemoryJournal`` that says it is remote and whose writes wait for a gate
(a slow or failing GCS write cannot be made on demand)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from kvres.actors.backend_setup.engine_registry import make_executor
from kvres.actors.config import BackendConfig
from kvres.actors.generation import GenerationRequest
from kvres.actors.host.backend import BackendHost
from kvres.actors.host.journal import MemoryJournal, SessionRecord
from kvres.actors.ray_actors.coldstore_actor import ColdStoreServer
from kvres.policy.backend_planner import plan_backend
from kvres.testing import LocalStorePort

from ..conftest import shared_model_path


class GatedJournal(MemoryJournal):
    remote = True

    def __init__(self) -> None:
        super().__init__()
        self.gated: set[str] = set()
        self.gate = threading.Event()
        self.refuse = False
        self.waiting = threading.Event()

    def save(self, record: SessionRecord) -> None:
        if record.session_id in self.gated:
            self.waiting.set()
            assert self.gate.wait(30)
            if self.refuse:
                raise OSError("the journal refused the write")
        super().save(record)


@pytest.fixture()
def setup() -> Iterator[tuple[BackendHost, GatedJournal]]:
    model = shared_model_path()
    cfg = BackendConfig(name="behind", model_path=model, n_ctx=1024, n_seq_max=2, kv_budget_tokens=1024, n_threads=1)
    journal = GatedJournal()
    host = BackendHost(cfg, make_executor(cfg, model), journal=journal)
    yield host, journal
    journal.gate.set()
    host.shutdown()


def _counting_reader(host: BackendHost, session_id: str) -> tuple[list[int], threading.Thread]:
    read = [0]
    stream = host.stream(session_id, GenerationRequest(max_tokens=300, ignore_eos=True))
    reader = threading.Thread(target=lambda: [read.__setitem__(0, read[0] + 1) for _ in stream], daemon=True)
    reader.start()
    while read[0] < 4:
        time.sleep(0.001)
    return read, reader


def test_a_call_is_answered_once_written_and_the_others_decode_meanwhile(setup: tuple[BackendHost, GatedJournal]) -> None:
    host, journal = setup
    for sid in ("slow", "other"):
        host.open_session(sid)
        host.append(sid, host.tokenize("once upon a time", add_bos=True))
    read, reader = _counting_reader(host, "other")
    journal.gated.add("slow")
    answers: list[object] = []
    call = threading.Thread(target=lambda: answers.append(host.generate("slow", 8, request_id="r1")), daemon=True)
    call.start()
    assert journal.waiting.wait(30)  # its steps are done: the record is being written
    before = read[0]
    deadline = time.monotonic() + 10
    while read[0] < before + 8 and time.monotonic() < deadline:
        time.sleep(0.001)
    assert read[0] >= before + 8, "the other session made no step while the record was written"
    assert not answers  # not answered before its record is written
    journal.gate.set()
    call.join(30)
    assert answers and len(answers[0]) == 8  # type: ignore[arg-type]
    record = journal.load("slow")
    assert record is not None and record.request_id == "r1" and record.token_log == host.tokens("slow")
    reader.join(60)


def test_a_write_that_fails_fails_the_call_and_keeps_the_last_record(setup: tuple[BackendHost, GatedJournal]) -> None:
    host, journal = setup
    host.open_session("slow")
    host.append("slow", host.tokenize("once upon a time", add_bos=True))
    held = host.tokens("slow")
    journal.gated.add("slow")
    journal.refuse = True
    journal.gate.set()
    with pytest.raises(OSError, match="refused the write"):
        host.generate("slow", 8)
    assert host.tokens("slow") == held  # the call's tokens are not kept: the last record is
    journal.gated.clear()
    assert len(host.generate("slow", 8)) == 8  # and the session goes on
    assert host.tokens("slow")[:len(held)] == held


@pytest.fixture()
def one_slot(tmp_path: Path) -> Iterator[tuple[BackendHost, GatedJournal, dict[str, ColdStoreServer]]]:
    """One sequence slot and a cold store: a call of another session parks the one there."""
    model = shared_model_path()
    cfg = BackendConfig(name="one-slot", model_path=model, n_ctx=1024, n_seq_max=1, kv_budget_tokens=1024,
                        n_threads=1)
    stores = {"node-a": ColdStoreServer(1 << 20, tmp_path / "a", 64 << 20)}
    journal = GatedJournal()
    host = BackendHost(cfg, make_executor(cfg, model), plan_backend, LocalStorePort("node-a", stores),
                       journal=journal)
    for sid in ("next", "slow"):  # "next" parked, "slow" in the slot
        host.open_session(sid)
        host.append(sid, host.tokenize("once upon a time", add_bos=True))
    yield host, journal, stores
    journal.gate.set()
    host.shutdown()


def _generate_gated(host: BackendHost, journal: GatedJournal) -> tuple[list[object], threading.Thread]:
    """"slow" generates 8 tokens and stops at the write of its record (the gate closed)."""
    journal.gated.add("slow")
    answers: list[object] = []

    def call() -> None:
        try:
            answers.append(host.generate("slow", 8, request_id="r1"))
        except Exception as exc:
            answers.append(exc)

    thread = threading.Thread(target=call, daemon=True)
    thread.start()
    assert journal.waiting.wait(30)  # its steps are done: its record is being written
    return answers, thread


def test_a_session_whose_record_is_being_written_gives_its_slot_to_the_next_call(
        one_slot: tuple[BackendHost, GatedJournal, dict[str, ColdStoreServer]]) -> None:
    host, journal, stores = one_slot
    answers, call = _generate_gated(host, journal)
    expected = host.tokens("slow")
    read, reader = _counting_reader(host, "next")  # runs now: "slow" is parked for it, its call not yet answered
    assert host.session_stats("slow")["state"] == "suspended" and _blocks(stores, "slow") > 0
    assert not answers
    journal.gate.set()
    call.join(30)
    assert answers and len(answers[0]) == 8  # type: ignore[arg-type]
    assert expected[-8:] == list(answers[0])  # type: ignore[call-overload]
    record = journal.load("slow")
    assert record is not None and record.request_id == "r1" and record.token_log == expected
    reader.join(60)
    assert host.tokens("slow") == expected  # and it comes back with its reply
    assert len(host.generate("slow", 4)) == 4


def test_a_write_that_fails_after_the_session_was_parked_takes_it_back_to_its_last_record(
        one_slot: tuple[BackendHost, GatedJournal, dict[str, ColdStoreServer]]) -> None:
    host, journal, stores = one_slot
    held = host.tokens("slow")
    answers, call = _generate_gated(host, journal)
    read, reader = _counting_reader(host, "next")
    assert host.session_stats("slow")["state"] == "suspended"
    journal.refuse = True
    journal.gate.set()
    call.join(30)
    assert answers and isinstance(answers[0], OSError)
    assert host.tokens("slow") == held  # the call's tokens are not kept
    assert _blocks(stores, "slow") == 0  # nor the KV it was parked with
    journal.gated.clear()
    journal.refuse = False
    reader.join(60)
    assert len(host.generate("slow", 8)) == 8  # and the session goes on from its last record
    assert host.tokens("slow")[:len(held)] == held
    record = journal.load("slow")
    assert record is not None and record.token_log == host.tokens("slow")


def _blocks(stores: dict[str, ColdStoreServer], session_id: str) -> int:
    return sum(len(s.list_session(session_id)) for s in stores.values())
