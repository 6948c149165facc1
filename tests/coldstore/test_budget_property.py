"""Property: after any sequence of operations both budgets hold and the store agrees with a model.

The model is a dict key -> payload of what should be stored: every put adds its block, and every key
the store reports as dropped leaves it. Operations include restarts (index rebuilt from the
files), promotions, deletes, session drops and puts while the disk is full (ENOSPC injected at the
write call).
"""

from __future__ import annotations

import errno
import os
import shutil
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from kvres.coldstore import (
    BlockKey,
    BlockTooLargeError,
    DiskFullError,
    DiskTier,
    RamTier,
    TieredStore,
    ram_cost,
)
from tests.hypothesis_profiles import examples

from .helpers import make_block

SESSIONS = ["a", "b", "c"]
SIZES = [0, 300, 1500, 4000, 7000, 20000]  # 7000 only fits disk, 20000 fits nothing
RAM_BUDGET = 9000
DISK_BUDGET = 16000


def _enospc(fd: int, buffers: object, offset: int) -> int:
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


class StoreMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="kvres-prop-"))
        self.store = self._open()
        self.model: dict[BlockKey, bytes] = {}
        self.counter = 0

    def _open(self) -> TieredStore:
        disk = DiskTier(self.dir, DISK_BUDGET, fsync=False)
        return TieredStore(RamTier(RAM_BUDGET), disk)

    def teardown(self) -> None:
        self.store.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def _apply_put(self, session: str, slot: int, size: int, priority: int) -> None:
        self.counter += 1
        payload = bytes([self.counter % 256]) * size
        block = make_block(payload, session_id=session, start=4 * slot)
        key = BlockKey.of(block)
        try:
            result = self.store.put(block, priority)
        except BlockTooLargeError:
            assert ram_cost(block) > RAM_BUDGET
            return
        except DiskFullError:
            assert ram_cost(block) > RAM_BUDGET  # only a disk-only block may fail outright
            return
        self.model[key] = payload
        for dropped in result.dropped:
            assert dropped != key
            self.model.pop(dropped)
        assert set(result.spilled).isdisjoint(result.dropped)

    @rule(session=st.sampled_from(SESSIONS), slot=st.integers(0, 5), size=st.sampled_from(SIZES),
          priority=st.integers(0, 2))
    def put(self, session: str, slot: int, size: int, priority: int) -> None:
        self._apply_put(session, slot, size, priority)

    @rule(session=st.sampled_from(SESSIONS), slot=st.integers(0, 5), size=st.sampled_from(SIZES))
    def put_with_full_disk(self, session: str, slot: int, size: int) -> None:
        real = os.pwritev
        os.pwritev = _enospc  # type: ignore[assignment]
        try:
            self._apply_put(session, slot, size, 0)
        finally:
            os.pwritev = real

    @rule(session=st.sampled_from(SESSIONS), slot=st.integers(0, 5), promote=st.booleans())
    def get(self, session: str, slot: int, promote: bool) -> None:
        key = BlockKey.of(make_block(b"", session_id=session, start=4 * slot))
        self.store.drain_dropped()  # drops of earlier puts are already applied to the model
        block = self.store.get(key, promote=promote)
        if key in self.model:
            assert block is not None and bytes(block.payload) == self.model[key]
        else:
            assert block is None
        for dropped in self.store.drain_dropped():  # promotion may push others out
            assert dropped != key
            self.model.pop(dropped)

    @rule(session=st.sampled_from(SESSIONS), slot=st.integers(0, 5))
    def delete(self, session: str, slot: int) -> None:
        key = BlockKey.of(make_block(b"", session_id=session, start=4 * slot))
        assert self.store.delete(key) == (key in self.model)
        self.model.pop(key, None)

    @rule(session=st.sampled_from(SESSIONS))
    def drop_session(self, session: str) -> None:
        expected = [k for k in self.model if k.session_id == session]
        assert self.store.drop_session(session) == len(expected)
        for key in expected:
            del self.model[key]

    @rule()
    def restart(self) -> None:
        """RAM is lost on restart; disk blocks come back from the files."""
        self.store.close()
        self.store = self._open()
        assert self.store.disk is not None
        self.model = {k: v for k, v in self.model.items() if k in self.store.disk}

    @invariant()
    def budgets_hold_and_contents_match(self) -> None:
        stats = self.store.stats()
        assert 0 <= stats.ram_bytes <= RAM_BUDGET
        assert 0 <= stats.disk_bytes <= DISK_BUDGET
        assert self.store.disk is not None
        files = list((self.dir / "blocks").glob("*/*.kvb"))
        assert sum(f.stat().st_size for f in files) == stats.disk_bytes
        assert len(files) == stats.disk_blocks
        ram_keys = set(self.store.ram.keys())
        disk_keys = set(self.store.disk.keys())
        assert ram_keys.isdisjoint(disk_keys)  # one copy per block
        assert ram_keys | disk_keys == set(self.model)


StoreMachine.TestCase.settings = settings(
    max_examples=examples(100),
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
test_budgets_and_model = StoreMachine.TestCase
