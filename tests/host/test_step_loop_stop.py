"""A step loop stops between steps: its pending calls fail with a typed error, nothing starts after,
and at interpreter exit every loop of the process is stopped before the engines' libraries go
(a loop thread left inside a decode while they unload would crash the exiting process)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from kvres.actors.host.scheduler import Job, LoopStoppedError, StepLoop, WaitCountingLock

ROOT = Path(__file__).resolve().parents[2]


def _until(condition: object, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():  # type: ignore[operator]
            return True
        time.sleep(0.01)
    return False


def test_stop_ends_the_loop_after_its_step_and_fails_what_is_pending() -> None:
    steps: list[int] = []
    in_step = threading.Event()

    def step(jobs: list[Job]) -> bool:
        in_step.set()
        steps.append(len(jobs))
        time.sleep(0.02)  # the step under way when stop() comes is finished, not cut
        return True  # the jobs never finish by themselves

    loop = StepLoop(WaitCountingLock(), step, "stopping")
    jobs = [loop.submit(Job(s, "append", feed=[1])) for s in ("a", "b")]
    assert in_step.wait(10)
    loop.stop()
    loop.join(10)
    assert loop._thread is not None and not loop._thread.is_alive()
    for job in jobs:
        with pytest.raises(LoopStoppedError, match="'stopping' stopped before session"):
            job.wait()
    ran = len(steps)
    time.sleep(0.05)
    assert len(steps) == ran  # nothing ran after
    with pytest.raises(LoopStoppedError, match="session 'c'"):
        loop.submit(Job("c", "append", feed=[1]))


def test_stop_ends_idle_work_under_way() -> None:
    pieces: list[float] = []

    def step(jobs: list[Job]) -> bool:
        for job in jobs:
            job.finish()
        return True

    def idle() -> bool:  # endless background work, one piece at a time
        pieces.append(time.monotonic())
        time.sleep(0.005)
        return True

    loop = StepLoop(threading.RLock(), step, "idle-work", on_idle=idle)
    loop.submit(Job("a", "append", feed=[1])).wait()
    assert _until(lambda: len(pieces) >= 3)
    loop.stop(10)  # (stop_loops, which stops every loop of the process, runs at exit: the test below)
    loop.join(10)
    assert loop._thread is not None and not loop._thread.is_alive()
    done = len(pieces)
    time.sleep(0.05)
    assert len(pieces) == done


def test_the_loops_are_stopped_at_interpreter_exit(tmp_path: Path) -> None:
    marker = tmp_path / "pieces"
    script = textwrap.dedent(f"""
        import threading, time
        from kvres.actors.host.scheduler import Job, StepLoop

        def step(jobs):
            for job in jobs:
                job.finish()
            return True

        def idle():
            with open({str(marker)!r}, "a", buffering=1) as f:  # line by line: "begin" is on disk at once
                f.write("begin\\n")
                time.sleep(0.05)  # where an engine call would be
                f.write("end\\n")
            return True

        loop = StepLoop(threading.RLock(), step, "exiting", on_idle=idle)
        loop.submit(Job("a", "append", feed=[1])).wait()
        time.sleep(0.2)  # the interpreter exits in the middle of the idle work
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    lines = marker.read_text().split()
    assert lines and lines[-1] == "end"  # the piece under way at exit was finished, none begun after it
