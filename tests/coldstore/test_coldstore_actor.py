"""ColdStoreActor on a real local Ray cluster (one per module, one CPU)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import ray

from kvres.actors.ray_actors.coldstore_actor import ColdStoreActor, ColdStoreServer
from kvres.coldstore import (
    BlockKey,
    BlockTooLargeError,
    InvalidSessionIdError,
    encoded_size,
    ram_cost,
)
from kvres.policy.ranges import Range

from .helpers import OTHER_FINGERPRINT, make_block, payload_of

MIB = 1 << 20
BLOCK = 256 << 10


def _address(buffer: Any) -> int:
    return int(np.frombuffer(buffer, np.uint8).__array_interface__["data"][0])


@pytest.fixture(scope="module")
def cluster() -> Iterator[None]:
    # address="local": always a private cluster, never one another test or user started.
    ray.init(address="local", num_cpus=1, include_dashboard=False, logging_level="ERROR", log_to_driver=False)
    try:
        yield
    finally:
        ray.shutdown()


@pytest.fixture(scope="module")
def actor(cluster: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    probe = make_block(bytes(BLOCK))
    handle = ColdStoreActor.options(name="kvres-coldstore-test", namespace="kvres-test").remote(
        4 * ram_cost(probe), str(tmp_path_factory.mktemp("coldstore")), 8 * encoded_size(probe)
    )
    yield handle
    ray.get(handle.close.remote())
    ray.kill(handle)


def test_put_get_round_trip_is_bit_exact(actor: Any) -> None:
    payload = payload_of(BLOCK, seed=1)
    block = make_block(np.frombuffer(payload, np.uint8).data, session_id="rt")
    result = ray.get(actor.put.remote(block))
    assert result.tier == "ram" and result.key == BlockKey.of(block)
    got = ray.get(actor.get.remote(BlockKey.of(block)))
    assert bytes(got.payload) == payload and got.token_ids == block.token_ids
    assert got.meta == block.meta and got.positions == block.positions
    assert ray.get(actor.get.remote(BlockKey("rt", Range(100, 104), block.fingerprint))) is None


def test_payloads_travel_out_of_band_through_the_object_store(cluster: None) -> None:
    block = make_block(payload_of(MIB, seed=2), session_id="zc")
    ref = ray.put(block)
    first, second = ray.get(ref), ray.get(ref)
    # Both reads map the same object-store memory: the payload was not unpickled into a copy.
    assert isinstance(first.payload, memoryview) and first.payload.readonly
    assert _address(first.payload) == _address(second.payload)
    assert bytes(first.payload) == block.payload


def test_batches_spill_and_stats(actor: Any) -> None:
    blocks = [make_block(payload_of(BLOCK, seed=i), session_id="batch", start=4 * i) for i in range(7)]
    results = ray.get(actor.put_many.remote(blocks))
    assert sum(len(r.spilled) for r in results) >= 3  # RAM holds 4 blocks at most
    got = ray.get(actor.get_many.remote([BlockKey.of(b) for b in blocks]))
    assert [bytes(g.payload) for g in got] == [b.payload for b in blocks]
    stats = ray.get(actor.stats.remote())
    for name in ("ram_bytes", "ram_blocks", "disk_bytes", "disk_blocks", "hits", "hits_ram",
                 "hits_disk", "misses", "spills", "drops", "spill_errors", "corrupt"):
        assert isinstance(stats[name], int), name
    assert stats["disk_blocks"] >= 3 and stats["hits_disk"] >= 3 and stats["spills"] >= 3
    assert stats["ram_bytes"] <= stats["ram_budget_bytes"]
    assert ray.get(actor.list_session.remote("batch")) == [BlockKey.of(b) for b in blocks]
    assert ray.get(actor.drop_session.remote("batch")) == 7
    assert ray.get(actor.list_session.remote("batch")) == []


def test_drops_are_reported(actor: Any) -> None:
    ray.get(actor.drain_dropped.remote())
    blocks = [make_block(payload_of(BLOCK, seed=i), session_id="full", start=4 * i) for i in range(14)]
    results = ray.get(actor.put_many.remote(blocks))
    dropped = [k for r in results for k in r.dropped]
    assert dropped and dropped == ray.get(actor.drain_dropped.remote())
    assert ray.get(actor.get.remote(dropped[0])) is None
    lost = sum(k.session_id == "full" for k in dropped)
    assert ray.get(actor.drop_session.remote("full")) == 14 - lost


def test_typed_errors_cross_the_actor_boundary(actor: Any) -> None:
    with pytest.raises(BlockTooLargeError):
        ray.get(actor.put.remote(make_block(bytes(4 * MIB), session_id="big")))
    with pytest.raises(InvalidSessionIdError):
        ray.get(actor.list_session.remote("../etc"))
    block = make_block(b"kv", session_id="fp", fingerprint=OTHER_FINGERPRINT)
    ray.get(actor.put.remote(block))
    assert ray.get(actor.delete_many.remote([BlockKey.of(block)])) == 1


def test_server_works_without_ray(tmp_path: Path) -> None:
    server = ColdStoreServer(MIB, tmp_path, 4 * MIB)
    block = make_block(bytearray(b"abc"), session_id="plain")
    server.put(block)
    got = server.get(BlockKey.of(block))
    assert got is not None and got.payload == b"abc"
    assert isinstance(got.payload, memoryview) and got.payload.readonly  # an owned, frozen copy
    assert server.tiers([BlockKey.of(block), BlockKey("plain", Range(8, 12), block.fingerprint)]) == ["ram", None]
    server.close()
