"""The RAM tier's reused copy buffers: a buffer comes back only when its copy's last view is gone,
within the idle bound, and a copy into a reused buffer holds exactly the new bytes."""

from __future__ import annotations

import gc
import pickle
import random

import numpy as np
import pytest

from kvres.coldstore import BlockKey, RamTier
from kvres.coldstore.payload_pool import HEADROOM_SHIFT, PayloadPool, size_class

from .helpers import make_block

MIB = 1 << 20


def test_size_class_rounds_up_by_at_most_a_32nd() -> None:
    for nbytes in [1, 4095, 4096, 4097, 100_000, 19_123_456, (1 << 30) + 1]:
        capacity = size_class(nbytes)
        assert nbytes <= capacity <= max(4096, nbytes + nbytes // 32 + 4096)
        assert size_class(capacity) == capacity


def test_a_released_buffer_is_reused_for_the_next_copy() -> None:
    pool = PayloadPool(64 * MIB)
    first = pool.copy(bytes(range(256)) * 4096)
    address = np.frombuffer(first, np.uint8).ctypes.data
    del first
    assert pool.idle_buffers == 1 and pool.allocated == 1
    second = pool.copy(b"\x07" * (MIB - 100))  # a little smaller: the same size class
    assert np.frombuffer(second, np.uint8).ctypes.data == address and pool.reused == 1
    assert bytes(second) == b"\x07" * (MIB - 100) and len(second) == MIB - 100 and second.readonly
    assert pool.idle_buffers == 0 and pool.idle_bytes == 0


def test_a_copy_still_held_is_never_handed_out_again() -> None:
    """The tier dropping a block does not release its buffer while someone holds the payload (a
    block read from the tier and not yet sent)."""
    ram = RamTier(64 * MIB, copy_payloads=True)
    block = make_block(bytearray(b"a" * MIB))
    ram.put(block)
    held = ram.pop(BlockKey.of(block))
    assert held is not None and ram.pool is not None and ram.pool.idle_buffers == 0
    other = make_block(bytearray(b"b" * MIB), start=8)
    ram.put(other)
    assert bytes(held.payload) == b"a" * MIB  # not overwritten by the second copy
    assert pickle.loads(pickle.dumps(held)).payload == b"a" * MIB
    del held
    gc.collect()
    assert ram.pool.idle_buffers == 1


def test_idle_buffers_stay_within_the_bound_oldest_out() -> None:
    capacity = size_class(MIB + (MIB >> HEADROOM_SHIFT))
    pool = PayloadPool(3 * capacity)
    copies = [pool.copy(bytes([i]) * MIB) for i in range(5)]
    kept = [np.frombuffer(c, np.uint8).ctypes.data for c in copies[2:]]
    for i in range(5):  # released in this order
        copies[i] = memoryview(b"")
    assert pool.idle_buffers == 3 and pool.idle_bytes == 3 * capacity
    again = [pool.copy(b"z" * MIB) for _ in range(3)]
    assert sorted(np.frombuffer(c, np.uint8).ctypes.data for c in again) == sorted(kept)  # the last released
    del again
    too_big = pool.copy(bytes(4 * MIB))
    del too_big
    assert pool.idle_bytes == 3 * capacity  # a buffer larger than the bound is not kept


def test_a_much_larger_idle_buffer_is_not_used_for_a_small_copy() -> None:
    pool = PayloadPool(64 * MIB)
    pool.copy(bytes(8 * MIB))  # released at once: nothing holds it
    small = pool.copy(b"x" * MIB)
    assert pool.reused == 0 and pool.idle_buffers == 1 and bytes(small) == b"x" * MIB


def test_churn_keeps_every_stored_block_intact() -> None:
    """Blocks of random sizes put, read and popped in random order: each reads back as written."""
    rng = random.Random(46)
    ram = RamTier(48 * MIB, copy_payloads=True)
    written: dict[BlockKey, bytes] = {}
    for i in range(300):
        size = rng.choice([MIB, 2 * MIB, 3 * MIB // 2]) + rng.randrange(4096)
        payload = rng.randbytes(64) * (size // 64)
        block = make_block(bytearray(payload), start=4 * i)
        key = BlockKey.of(block)
        for evicted in ram.put(block):
            del written[evicted.key]
        written[key] = payload
        if written and rng.random() < 0.5:
            gone = rng.choice(list(written))
            popped = ram.pop(gone)
            assert popped is not None and bytes(popped.payload) == written.pop(gone)
    for key, payload in written.items():
        got = ram.get(key)
        assert got is not None and bytes(got.payload) == payload
    assert ram.pool is not None and ram.pool.reused > 60  # 92 with this seed
    assert ram.pool.idle_bytes <= ram.pool.max_idle_bytes


def test_a_negative_bound_is_refused() -> None:
    with pytest.raises(ValueError, match="max_idle_bytes"):
        PayloadPool(-1)
