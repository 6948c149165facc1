"""StepLoop tells its owner when it takes up calls and when the last one is done (the hook a
backend uses to hold its cold-store writes back while it runs calls)."""

from __future__ import annotations

import threading
import time

from kvres.actors.scheduler import Job, StepLoop


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
