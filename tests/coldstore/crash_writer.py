"""Writer process for the crash-safety test: ``python crash_writer.py DIR FIRST COUNT``.

Stores blocks FIRST .. FIRST+COUNT-1 into a DiskTier at DIR and prints ``done <i>`` after each
put returns. Writes are slowed down (at most 256 KiB per ``pwritev``, 2 ms apart) so that a
SIGKILL from the test lands in the middle of a write.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from kvres.coldstore import DiskTier  # noqa: E402
from tests.coldstore.helpers import make_block, payload_of  # noqa: E402

CHUNK = 256 << 10


def block_for(i: int):  # type: ignore[no-untyped-def]
    """Block number ``i`` (deterministic, so the test can rebuild the expected bytes)."""
    size = [0, 1, 1000, 2 << 20][i % 4]
    return make_block(payload_of(size, seed=i), session_id="crash", start=4 * i)


def _slow_pwritev(real):  # type: ignore[no-untyped-def]
    def pwritev(fd: int, buffers: list[memoryview], offset: int) -> int:
        first = memoryview(buffers[0])[:CHUNK]
        time.sleep(0.002)
        return int(real(fd, [first], offset))

    return pwritev


def main() -> None:
    path, first, count = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    os.pwritev = _slow_pwritev(os.pwritev)  # type: ignore[assignment]
    disk = DiskTier(path, 1 << 30)
    for i in range(first, first + count):
        disk.put(block_for(i))
        print(f"done {i}", flush=True)


if __name__ == "__main__":
    main()
