"""RayStorePort's write-behind on a real local Ray cluster: writes wait while the backend runs calls
(``defer_writes``), go out once it is between calls, any call of the port sends them first, and the
batches queued meanwhile go out as one store call."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
import ray

from kvres.actors.host.store_ports import ColdRef
from kvres.actors.ray_actors import ray_store_port
from kvres.actors.ray_actors.coldstore_actor import ColdStoreActor
from kvres.actors.ray_actors.ray_store_port import RayStorePort
from kvres.coldstore import BlockKey

from .helpers import make_block

NAMESPACE = "kvres-port-test"
STORE = "kvres-coldstore-port-test"


@pytest.fixture(scope="module")
def store() -> Iterator[Any]:
    ray.init(address="local", num_cpus=1, include_dashboard=False, logging_level="ERROR", log_to_driver=False)
    try:
        handle = ColdStoreActor.options(name=STORE, namespace=NAMESPACE).remote(16 << 20)
        ray.get(handle.stats.remote())
        yield handle
    finally:
        ray.shutdown()


@pytest.fixture
def port(store: Any, monkeypatch: pytest.MonkeyPatch) -> RayStorePort:
    monkeypatch.setattr(ray_store_port, "WRITE_DEFER_S", 60.0)  # only the backend going idle releases them here
    return RayStorePort(STORE, NAMESPACE)


def _blocks(session_id: str, starts: range) -> list[Any]:
    return [make_block(bytes(64), session_id=session_id, start=s) for s in starts]


def _held(store: Any, session_id: str) -> list[BlockKey]:
    return list(ray.get(store.list_session.remote(session_id)))


def _until(condition: Any, timeout: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.02)
    return False


def test_deferred_writes_wait_for_the_backend_to_be_idle(store: Any, port: RayStorePort) -> None:
    port.defer_writes(True)
    blocks = _blocks("idle", range(0, 40, 4))
    port.put_many(blocks)
    time.sleep(0.3)
    assert _held(store, "idle") == []  # held back while the backend is busy
    assert port.get_many([BlockKey.of(b) for b in blocks]) == blocks  # read from the stage meanwhile
    port.defer_writes(False)
    assert _until(lambda: len(_held(store, "idle")) == len(blocks))


def test_held_writes_beyond_the_stage_send_just_the_oldest(store: Any) -> None:
    """While the backend runs calls, the blocks held stay within the stage's size: each write that
    outgrows it sends the oldest, as few as bring it back within; the younger stay held (a resume
    may yet take them back) until the backend is between calls."""
    port = RayStorePort(STORE, NAMESPACE, stage_bytes=3 * 64)  # three blocks of 64 bytes
    port.defer_writes(True)
    blocks = _blocks("outgrown", range(0, 20, 4))
    for block in blocks[:4]:
        port.put_many([block])
    assert _until(lambda: _held(store, "outgrown") == [BlockKey.of(blocks[0])])
    port.put_many([blocks[4]])
    assert _until(lambda: len(_held(store, "outgrown")) == 2)
    time.sleep(0.3)
    assert sorted(_held(store, "outgrown"), key=lambda k: k.token_range.start) == [
        BlockKey.of(blocks[0]), BlockKey.of(blocks[1])]  # the three youngest still held
    assert port.pop_many([BlockKey.of(blocks[4])]) == [blocks[4]]  # taken back: never sent
    port.defer_writes(False)
    assert _until(lambda: len(_held(store, "outgrown")) == 4)
    time.sleep(0.2)
    assert BlockKey.of(blocks[4]) not in _held(store, "outgrown")


def test_a_call_of_the_port_sends_what_is_held_first(store: Any, port: RayStorePort) -> None:
    port.defer_writes(True)
    blocks = _blocks("flush", range(0, 16, 4))
    port.put_many(blocks)
    # a call that needs the store's answer sends the held writes before itself, in order
    assert port.tiers([BlockKey.of(b) for b in blocks]) == ["ram"] * len(blocks)
    port.defer_writes(False)


def test_batches_held_together_go_out_as_one_call_each_run(store: Any, port: RayStorePort) -> None:
    port.defer_writes(True)
    first, second, third = _blocks("merge", range(0, 8, 4)), _blocks("merge", range(8, 16, 4)), _blocks(
        "merge", range(16, 24, 4))
    port.put_many(first)
    port.put_many(second)
    port.delete_many([BlockKey.of(first[0])])  # a call of the port: sends the two puts first
    assert _until(lambda: len(_held(store, "merge")) == 3)
    port.put_many(third)
    assert port.pop_many([BlockKey.of(second[0])]) == [second[0]]  # read from the stage, deleted behind
    port.put_many(_blocks("merge", range(24, 28, 4)))
    with port._sent:  # what the sender would submit next, in order
        batches = []
        while port._outbox:
            batches.append(port._next_batch())
    assert [(m, len(args[0])) for m, args in batches] == [("put_many", 2), ("delete_many", 1), ("put_many", 1)]
    port.defer_writes(False)


def test_a_block_taken_back_before_it_was_sent_never_reaches_the_store(store: Any, port: RayStorePort) -> None:
    port.defer_writes(True)
    blocks = _blocks("unsent", range(0, 24, 4))
    port.put_many(blocks[:4])
    port.put_many(blocks[4:])
    taken = [blocks[0], blocks[2], blocks[4], blocks[5]]  # the whole second batch, part of the first
    assert port.pop_many([BlockKey.of(b) for b in taken]) == taken
    with port._sent:
        assert [(m, [BlockKey.of(b) for b in args[0]]) for m, args, _ in port._outbox] == [
            ("put_many", [BlockKey.of(blocks[1]), BlockKey.of(blocks[3])])]  # no delete queued
    port.defer_writes(False)
    assert _until(lambda: len(_held(store, "unsent")) == 2)
    time.sleep(0.2)
    assert sorted(_held(store, "unsent"), key=lambda k: k.token_range.start) == [
        BlockKey.of(blocks[1]), BlockKey.of(blocks[3])]


def test_a_park_taken_back_by_the_next_call_sends_the_store_nothing(
    store: Any, port: RayStorePort, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A suspend between steps (no step loop running: the port idle for long) queues its blocks,
    and they wait for its answer to leave and its driver's next call: a resume right after takes
    them back from the stage, and neither a put nor a delete ever goes to the store."""
    monkeypatch.setattr(ray_store_port, "SEND_AFTER_IDLE_S", 5.0)  # the next call comes within it, however slow
    blocks = _blocks("parked", range(0, 12, 4))
    port.put_many(blocks)
    time.sleep(0.2)  # the suspend's answer goes back, the driver asks for the resume
    assert port.pop_many([BlockKey.of(b) for b in blocks]) == blocks
    with port._sent:
        assert not port._outbox and not port._sending and not port._settling  # nothing went out, nothing to delete
    assert _held(store, "parked") == []


def test_send_now_sends_what_is_held_while_the_backend_stays_busy(store: Any, port: RayStorePort) -> None:
    port.defer_writes(True)
    blocks = _blocks("handover", range(0, 16, 4))
    port.put_many(blocks)
    port.send_now()  # out at once, though the backend stays busy
    assert _until(lambda: len(_held(store, "handover")) == len(blocks))
    later = _blocks("handover", range(16, 24, 4))
    port.put_many(later)
    time.sleep(0.3)
    assert len(_held(store, "handover")) == len(blocks)  # held again until the backend is idle
    port.defer_writes(False)
    assert _until(lambda: len(_held(store, "handover")) == len(blocks) + len(later))


def test_flush_returns_once_the_store_holds_every_write(store: Any, port: RayStorePort) -> None:
    """A session handed to another backend: that backend reads its blocks straight from the store
    at once, in calls Ray does not order after this port's, so the handover waits until they are
    stored. Big batches, so a store still writing when flush returned would be caught here."""
    port.defer_writes(True)
    for round_ in range(5):
        blocks = [make_block(bytes(256 << 10), session_id=f"flushed-{round_}", start=s) for s in range(0, 64, 4)]
        port.put_many(blocks)
        port.flush()
        assert len(_held(store, f"flushed-{round_}")) == len(blocks)  # no wait: already there
        other = RayStorePort(STORE, NAMESPACE)  # another backend's port: nothing staged there
        assert all(b is not None for b in other.pop_many([BlockKey.of(b) for b in blocks]))
    port.defer_writes(False)


def _refs(blocks: list[Any], store: str = STORE) -> list[Any]:
    return [ColdRef(store, BlockKey.of(b), b.payload_nbytes) for b in blocks]


def test_a_prefetch_reads_parked_blocks_ahead_so_the_take_asks_the_store_nothing(
        store: Any, port: RayStorePort, monkeypatch: pytest.MonkeyPatch) -> None:
    """A call for a suspended session came in: its blocks, pushed out of the stage by later
    suspends, are read while other steps run; the resume's take then needs no store call, and
    the store no longer holds them afterwards."""
    small = RayStorePort(STORE, NAMESPACE, stage_bytes=100)  # holds one of the four 64-byte blocks
    parked = _blocks("ahead", range(0, 16, 4))
    small.put_many(parked)
    small.flush()
    assert len(small._stage) < len(parked)
    small.prefetch(_refs(parked))
    assert _until(lambda: not small._fetching)
    calls: list[str] = []
    monkeypatch.setattr(small, "_call", lambda method, *args: calls.append(method))  # the store is not asked
    assert small.take(_refs(parked)) == parked
    assert calls == []
    small.flush()  # the delete of what was read ahead went out behind the take
    assert _held(store, "ahead") == []


def test_a_prefetch_keeps_staged_blocks_for_the_take_whatever_later_suspends_push_out(
        store: Any, port: RayStorePort) -> None:
    small = RayStorePort(STORE, NAMESPACE, stage_bytes=200)
    mine = _blocks("kept", range(0, 8, 4))
    small.put_many(mine)
    small.prefetch(_refs(mine))  # staged now: held for the take without a store read
    small.put_many(_blocks("others", range(0, 32, 4)))  # later suspends fill the stage
    assert not any(BlockKey.of(b) in small._stage for b in mine)
    assert small.pop_many([BlockKey.of(b) for b in mine]) == mine
    small.flush()
    assert _held(store, "kept") == []
    small.delete_many([BlockKey.of(b) for b in _blocks("others", range(0, 32, 4))])


def test_a_read_ahead_that_lands_after_its_key_was_taken_and_parked_again_is_dropped(
        store: Any, port: RayStorePort) -> None:
    """Keys name a session's range, not one suspend: a read ahead that lands after the block was
    taken and the session parked again under the same key must not hand the next take the older
    copy."""
    first = make_block(b"old" * 20, session_id="again", start=0)
    key = BlockKey.of(first)
    port.put_many([first])
    port.flush()
    port._stage.clear()
    port._stage_bytes = 0
    port.prefetch(_refs([first]))
    assert port.pop_many([key]) == [first]  # the resume: waits for the read ahead, takes its copy
    second = make_block(b"new" * 20, session_id="again", start=0)
    port.put_many([second])  # parked again
    port._arrived([key], [first])  # a read of the old copy landing now (one the take stopped waiting for)
    assert key not in port._fetched
    assert port.pop_many([key]) == [second]
    port.flush()
    assert _held(store, "again") == []


def test_a_prefetch_of_blocks_the_store_no_longer_has_leaves_the_take_none(store: Any, port: RayStorePort) -> None:
    gone = _blocks("gone", range(0, 8, 4))
    port.prefetch(_refs(gone))  # never parked (or dropped since): nothing to read
    assert _until(lambda: not port._fetching)
    assert port.pop_many([BlockKey.of(b) for b in gone]) == [None, None]
    port.prefetch(_refs(gone, store="kvres-coldstore-elsewhere"))  # another store's: not this port's to read
    assert not port._fetching


def test_a_home_stage_is_a_quarter_of_its_stores_ram_budget_and_at_least_the_least_stage(store: Any) -> None:
    """A backend's stage grows with the RAM its node's store parks sessions in (a fleet whose parked
    sessions come back within the write deferral then keeps them here); a store that does not
    answer leaves it at the least stage rather than holding the backend's start."""
    assert ray_store_port.stage_bytes_for(0) == ray_store_port.STAGE_BYTES
    assert ray_store_port.stage_bytes_for(4096 << 20) == 1024 << 20
    assert ray_store_port.stage_bytes_for(ray_store_port.STAGE_BYTES) == ray_store_port.STAGE_BYTES
    assert ray_store_port.home_stage_bytes(STORE, NAMESPACE) == ray_store_port.STAGE_BYTES  # 16 MiB of RAM
    big = ColdStoreActor.options(name="kvres-coldstore-port-big", namespace=NAMESPACE).remote(8 << 30)
    try:
        ray.get(big.stats.remote())
        assert ray_store_port.home_stage_bytes("kvres-coldstore-port-big", NAMESPACE) == 2 << 30
    finally:
        ray.kill(big)
    assert ray_store_port.home_stage_bytes("kvres-coldstore-nowhere", NAMESPACE) == ray_store_port.STAGE_BYTES
