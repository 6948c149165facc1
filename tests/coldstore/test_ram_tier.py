"""RAM tier: byte budget, priority-then-LRU eviction, zero-copy storage."""

from __future__ import annotations

import numpy as np
import pytest

from kvres.coldstore import BlockKey, BlockTooLargeError, Evicted, RamTier, ram_cost

from .helpers import make_block

KIB = 1024


def test_budget_holds_and_lru_goes_first() -> None:
    one = ram_cost(make_block(bytes(KIB)))
    ram = RamTier(3 * one)
    blocks = [make_block(bytes(KIB), start=4 * i) for i in range(4)]
    for b in blocks[:3]:
        assert ram.put(b) == []
    assert ram.get(BlockKey.of(blocks[0])) is blocks[0]  # 0 is now the most recent
    evicted = ram.put(blocks[3])
    assert evicted == [Evicted(BlockKey.of(blocks[1]), blocks[1])]
    assert ram.used_bytes == 3 * one <= ram.budget_bytes
    assert [k.token_range.start for k in ram.keys_for_session("sess-1")] == [0, 8, 12]


def test_low_priority_is_evicted_before_recency() -> None:
    one = ram_cost(make_block(bytes(KIB)))
    ram = RamTier(2 * one)
    pinned = make_block(bytes(KIB), start=0)
    cheap = make_block(bytes(KIB), start=4)
    ram.put(pinned, priority=5)
    ram.put(cheap, priority=0)
    ram.get(BlockKey.of(cheap))
    newcomer = make_block(bytes(KIB), start=8)
    assert ram.put(newcomer, priority=1) == [Evicted(BlockKey.of(cheap), cheap)]
    assert ram.pop_coldest() is newcomer  # priority 1 < 5
    assert ram.pop_coldest() is pinned
    assert ram.pop_coldest() is None and ram.used_bytes == 0


def test_one_put_can_evict_several_and_replacing_a_key_rebills() -> None:
    small = ram_cost(make_block(bytes(KIB)))
    ram = RamTier(4 * small)
    for i in range(4):
        ram.put(make_block(bytes(KIB), start=4 * i))
    big = make_block(bytes(3 * KIB), start=100)
    evicted = ram.put(big)
    assert len(evicted) == 3 and ram.used_bytes <= ram.budget_bytes
    replacement = make_block(bytes(10), start=100)
    assert ram.put(replacement) == []
    assert ram.peek(BlockKey.of(big)) is replacement
    assert ram.used_bytes == small + ram_cost(replacement)


def test_too_large_block_is_refused_with_sizes() -> None:
    ram = RamTier(1000)
    with pytest.raises(BlockTooLargeError, match=r"costs \d+ bytes .* budget is 1000"):
        ram.put(make_block(bytes(2000)))
    assert len(ram) == 0 and ram.used_bytes == 0


def test_blocks_are_stored_without_copy_by_default() -> None:
    arr = np.arange(4096, dtype=np.uint8)
    block = make_block(memoryview(arr))
    ram = RamTier(1 << 20)
    ram.put(block)
    got = ram.get(BlockKey.of(block))
    assert got is block and np.shares_memory(np.frombuffer(got.payload, np.uint8), arr)


def test_copy_payloads_owns_the_bytes() -> None:
    buf = bytearray(b"a" * 100)
    ram = RamTier(1 << 20, copy_payloads=True)
    block = make_block(buf)
    ram.put(block)
    buf[:] = b"b" * 100
    got = ram.get(BlockKey.of(block))
    assert got is not None and got.payload == b"a" * 100
    assert isinstance(got.payload, memoryview) and got.payload.readonly
    immutable = make_block(b"c" * 100, start=50)
    ram.put(immutable)
    assert ram.get(BlockKey.of(immutable)) is immutable  # bytes are adopted, never copied
    owned = b"d" * 120
    view = make_block(memoryview(owned)[10:110], start=100)  # a view of bytes (an export made in place)
    ram.put(view)
    assert ram.get(BlockKey.of(view)) is view


def test_delete_pop_and_contains() -> None:
    ram = RamTier(1 << 20)
    block = make_block(b"xyz")
    key = BlockKey.of(block)
    ram.put(block)
    assert key in ram and len(ram) == 1
    assert ram.pop(key) is block
    assert ram.pop(key) is None and not ram.delete(key) and ram.get(key) is None
    assert ram.used_bytes == 0


@pytest.mark.parametrize("budget", [-1, 1.5, True])
def test_bad_budget(budget: object) -> None:
    with pytest.raises(ValueError, match="budget_bytes"):
        RamTier(budget)  # type: ignore[arg-type]
