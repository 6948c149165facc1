"""Threads blocked on the backend's lock while the step loop runs step after step get in between
two steps: the lock counts its waiters (``WaitCountingLock``) and the loop gives up the GIL for
them, where it would otherwise take the lock again before a woken waiter runs (calls then joined
the batch many steps late, and control calls waited as long)."""

from __future__ import annotations

import threading
import time

from kvres.actors.host.scheduler import Job, StepLoop, WaitCountingLock


def test_threads_waiting_for_the_lock_get_in_between_steps() -> None:
    lock = WaitCountingLock()
    steps: list[int] = []

    def step(jobs: list[Job]) -> bool:  # like an engine step: a call that lets the GIL go, then Python
        steps.append(len(jobs))
        time.sleep(0.002)
        x = 0
        for i in range(3000):
            x += i
        for job in jobs:
            job.remaining -= 1
            if job.remaining <= 0:
                job.finish()
        return True

    loop = StepLoop(lock, step, "t")
    first = loop.submit(Job("first", "generate", remaining=100_000))
    n = 6

    def submit(i: int) -> None:
        with lock:  # as BackendHost._submit does
            loop.submit(Job(f"s{i}", "generate", remaining=1))

    threads = [threading.Thread(target=submit, args=(i,)) for i in range(n)]
    with lock:  # hold the loop back until every submitter waits for the lock
        for t in threads:
            t.start()
        while lock.waiting < n:
            time.sleep(0.001)
        at = len(steps)
    for t in threads:
        t.join()
    joined = len(steps) - at
    first.remaining = 0
    first.wait()
    assert joined <= 4, f"{n} waiting threads took {joined} steps to get the lock"


def test_the_lock_counts_its_waiters_and_serves_a_condition() -> None:
    lock = WaitCountingLock()
    cond = threading.Condition(lock)  # type: ignore[arg-type]
    got = threading.Event()

    def waiter() -> None:
        with lock:
            got.set()

    with lock:
        with lock:  # reentrant
            t = threading.Thread(target=waiter)
            t.start()
            while lock.waiting == 0:
                pass
            assert lock.waiting == 1
        assert not got.is_set()
        assert not cond.wait(timeout=0.01)  # releases the lock while waiting: the waiter gets in
        assert got.is_set()
    t.join()
    assert lock.waiting == 0
    assert lock.acquire(blocking=False)
    lock.release()
