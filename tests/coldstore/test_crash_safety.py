"""Crash safety: a writer process SIGKILLed in the middle of writes never leaves a loadable partial
block, and every block whose put completed loads bit-exact after restart."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

from kvres.coldstore import BlockKey, DiskTier

from .crash_writer import block_for

WRITER = Path(__file__).with_name("crash_writer.py")


def _partial_temp_file(tmp_dir: Path) -> bool:
    """Whether a temp file holds some but not all of a 2 MiB block's bytes."""
    for part in tmp_dir.glob("*.part"):
        try:
            size = part.stat().st_size
        except FileNotFoundError:  # renamed or removed meanwhile
            continue
        if 0 < size < (2 << 20):
            return True
    return False


def _wait_stopped(pid: int) -> None:
    """Block until the kernel reports ``pid`` as stopped (state T)."""
    stat_file = Path(f"/proc/{pid}/stat")
    deadline = time.monotonic() + 5
    while stat_file.read_text().rsplit(")", 1)[1].split()[0] not in ("T", "t"):
        assert time.monotonic() < deadline, "writer did not stop"
        time.sleep(0.0005)


def _run_and_kill(store: Path, first: int, kill_after: int) -> set[int]:
    """Start a writer, SIGKILL it mid-write once ``kill_after`` puts completed; return the done set."""
    proc = subprocess.Popen(
        [sys.executable, str(WRITER), str(store), str(first), "1000"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    done: set[int] = set()
    try:
        assert proc.stdout is not None
        deadline = time.monotonic() + 60
        while len(done) < kill_after:
            line = proc.stdout.readline()
            assert line, f"writer exited early: {proc.wait(timeout=10)} {proc.stderr.read() if proc.stderr else ''}"
            done.add(int(line.split()[1]))
            assert time.monotonic() < deadline, "writer too slow"
        # Freeze the writer while a big block is half written, then kill it there.
        while True:
            assert time.monotonic() < deadline, "no write in progress seen"
            if _partial_temp_file(store / "tmp"):
                proc.send_signal(signal.SIGSTOP)
                _wait_stopped(proc.pid)
                if _partial_temp_file(store / "tmp"):
                    break
                proc.send_signal(signal.SIGCONT)
            time.sleep(0.001)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        assert proc.returncode == -signal.SIGKILL
        for line in proc.stdout.read().splitlines():  # lines printed before the kill landed
            done.add(int(line.split()[1]))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
        if proc.stdout:
            proc.stdout.close()
        if proc.stderr:
            proc.stderr.close()
    return done


def test_sigkill_mid_write_then_restart(tmp_path: Path) -> None:
    store = tmp_path / "store"
    completed: set[int] = set()
    first = 0
    for kill_after in (5, 3):
        completed |= _run_and_kill(store, first, kill_after)
        assert _partial_temp_file(store / "tmp")  # the kill really left a half-written file
        with DiskTier(store, 1 << 30) as disk:
            assert list((store / "tmp").iterdir()) == []  # partial files are gone
            indexed = {k.token_range.start // 4 for k in disk}
            assert completed <= indexed
            # At most the one in-flight block may be there too, and only if it is complete.
            assert len(indexed - completed) <= 1
            for i in indexed:
                expected = block_for(i)
                got = disk.get(BlockKey.of(expected))
                assert got is not None and bytes(got.payload) == bytes(expected.payload), i
                assert got.token_ids == expected.token_ids
            first = max(indexed) + 1
