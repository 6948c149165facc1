"""StepLoop tells its owner when it takes up calls and when the last one is done (the hook a
backend uses to hold its cold-store writes back while it runs calls), and runs its idle work
when no call is left."""

from __future__ import annotations

import threading
import time

from kvres.actors.host.scheduler import Job, StepLoop


def test_on_busy_brackets_each_stretch_of_work() -> None:
    lock = threading.RLock()
    seen: list[bool] = []
    release = threading.Event()

    def step(jobs: list[Job]) -> bool:  # the jobs run until released (the lock is free between steps)
        if release.is_set():
            for job in jobs:
                job.finish()
        else:
            time.sleep(0.001)
        return True

    loop = StepLoop(lock, step, "t", on_busy=seen.append)
    first, second = loop.submit(Job("a", "append", feed=[1])), loop.submit(Job("b", "append", feed=[2]))
    deadline = time.monotonic() + 10
    while not seen and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.05)
    assert seen == [True]  # busy while the jobs run, not idle yet
    release.set()
    first.wait()
    second.wait()
    while len(seen) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert seen == [True, False]
    loop.submit(Job("c", "append", feed=[3])).wait()
    while len(seen) < 4 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert seen == [True, False, True, False]


def test_a_failing_hook_does_not_stop_the_loop() -> None:
    def hook(busy: bool) -> None:
        raise RuntimeError("hook failed")

    def step(jobs: list[Job]) -> bool:
        for job in jobs:
            job.finish()
        return True

    loop = StepLoop(threading.RLock(), step, "t", on_busy=hook)
    loop.submit(Job("a", "append", feed=[1])).wait()
    loop.submit(Job("b", "append", feed=[1])).wait()


def test_on_idle_runs_piece_by_piece_once_the_calls_are_done() -> None:
    lock = threading.RLock()
    events: list[str] = []
    pieces = [3]  # on_idle has three pieces of work, one per call

    def step(jobs: list[Job]) -> bool:
        events.append("step")
        for job in jobs:
            job.finish()
        return True

    def idle() -> bool:
        assert not lock._is_owned()  # type: ignore[attr-defined]  # called without the lock: the hook takes it itself
        events.append("idle")
        pieces[0] -= 1
        return pieces[0] > 0

    loop = StepLoop(lock, step, "t", on_idle=idle)
    loop.submit(Job("a", "append", feed=[1])).wait()
    deadline = time.monotonic() + 10
    while events.count("idle") < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.05)
    assert events == ["step", "idle", "idle", "idle"]  # after the call, until it has nothing left
    pieces[0] = 1
    loop.submit(Job("b", "append", feed=[1])).wait()
    while events.count("idle") < 4 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert events[4:] == ["step", "idle"]  # and again after the next call


def test_a_failing_idle_hook_does_not_stop_the_loop() -> None:
    calls = [0]

    def idle() -> bool:
        calls[0] += 1
        raise RuntimeError("idle work failed")

    def step(jobs: list[Job]) -> bool:
        for job in jobs:
            job.finish()
        return True

    loop = StepLoop(threading.RLock(), step, "t", on_idle=idle)
    loop.submit(Job("a", "append", feed=[1])).wait()
    deadline = time.monotonic() + 10
    while not calls[0] and time.monotonic() < deadline:
        time.sleep(0.01)
    loop.submit(Job("b", "append", feed=[1])).wait()
    assert calls[0] >= 1


def test_request_idle_runs_the_idle_work_again() -> None:
    """Background work that finished a piece elsewhere (a reader thread) asks for the next:
    on_idle is called again without any call having come."""
    calls: list[float] = []

    def step(jobs: list[Job]) -> bool:
        for job in jobs:
            job.finish()
        return True

    def idle() -> bool:
        calls.append(time.monotonic())
        return False  # nothing more for the loop itself

    loop = StepLoop(threading.RLock(), step, "t", on_idle=idle)
    loop.submit(Job("a", "append", feed=[1])).wait()
    deadline = time.monotonic() + 10
    while not calls and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.05)
    assert len(calls) == 1  # once after the call, then it waits
    loop.request_idle()
    while len(calls) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.05)
    assert len(calls) == 2
