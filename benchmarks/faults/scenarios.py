"""The fault scenarios: each runs a fault-free reference and the same calls with one fault.

Primitives:
- ``Sizes(prompt, tokens, long_generate, long_append)``: how big the calls are.
- ``Row``: one scenario's outcome: the error the driver saw ("none" or the kvres error's type),
  tokens lost (committed tokens missing afterwards), tokens recomputed from the log (and how many
  of them inexactly), seconds from the fault to the answer of the next call and the same call's
  seconds without the fault, whether the greedy tokens after the fault are those of the reference;
  how many sessions the fault hit, lost, and continued identically.
- ``SCENARIOS``: name -> function ``(cluster, sizes) -> Row``; ``QUICK``: the ones ``--quick`` runs.

Tokens lost are counted against what the driver was told was committed: every call that
answered, none that raised.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from kvres.cluster import SessionPolicy
from kvres.policy import KvresError

from .cluster import (
    DAMAGES,
    KV_BUDGET,
    FaultCluster,
    block_files,
    damage,
    fill,
    pid_of,
    sigkill,
    wait_parked,
    wait_restarted,
)


@dataclass(frozen=True)
class Sizes:
    prompt: int = 300
    tokens: int = 64
    long_generate: int = 512
    long_append: int = 1500


@dataclass
class Row:
    scenario: str
    error: str = "none"
    tokens_lost: int = 0
    tokens_recomputed: int = 0
    inexact_tokens: int = 0
    recover_s: float = 0.0
    baseline_s: float = 0.0
    same_tokens: bool = True
    note: str = ""
    sessions: int = 1  # sessions the fault hit
    sessions_lost: int = 0  # of them, those that did not answer again
    identical: int | None = None  # of them, those whose continuation is the fault-free one (None: all or none)

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["recover_over_baseline"] = self.recover_s / self.baseline_s if self.baseline_s > 0 else None
        if self.identical is None:
            out["identical"] = self.sessions if self.same_tokens else 0
        return out


def prompt(n: int, seed: int = 0) -> list[int]:
    return [1, *[100 + (seed * 37 + 11 * i + (i * i) % 13) % 400 for i in range(n - 1)]]


def _counter(s: Any, name: str) -> int:
    return int(s.stats()["counters"].get(name, 0))


def _recomputed(sessions: list[Any]) -> tuple[int, int]:
    return (sum(_counter(s, "recomputed_tokens") for s in sessions),
            sum(_counter(s, "inexact_recomputed_tokens") for s in sessions))


def _next_answer(call: Callable[[], Any]) -> tuple[Any, str, float]:
    """The call's answer, the kvres error seen on the way (repeated once after it), and when."""
    try:
        return call(), "none", time.monotonic()
    except KvresError as exc:
        error = type(exc).__name__
    return call(), error, time.monotonic()


def _timed(call: Callable[[], Any]) -> tuple[Any, float]:
    t0 = time.monotonic()
    out = call()
    return out, time.monotonic() - t0


def _lost(sessions: list[Any], committed: list[int]) -> int:
    return sum(max(0, want - int(s.stats()["token_count"])) for s, want in zip(sessions, committed, strict=True))


# ---- the backend dies --------------------------------------------------------------------------


def backend_between_calls(c: FaultCluster, z: Sizes) -> Row:
    p = prompt(z.prompt)
    ref = c.manager.open_session(backend="bench")
    ref.append(p)
    ref.generate(8)
    want, base = _timed(lambda: ref.generate(z.tokens))
    ref.close()
    s = c.manager.open_session(backend="bench")
    s.append(p)
    s.generate(8)
    t0 = sigkill(pid_of(c.backend))
    got, error, t1 = _next_answer(lambda: s.generate(z.tokens))
    row = Row("backend killed between calls", error, _lost([s], [len(p) + 8 + len(got)]),
              *_recomputed([s]), t1 - t0, base, got == want)
    s.close()
    return row


def backend_mid_generate(c: FaultCluster, z: Sizes) -> Row:
    p = prompt(z.prompt, 1)
    ref = c.manager.open_session(backend="bench")
    ref.append(p)
    want, base = _timed(lambda: ref.generate(z.long_generate))
    ref.close()
    s = c.manager.open_session(backend="bench")
    s.append(p)
    out: dict[str, Any] = {}

    def run() -> None:
        out["tokens"], out["error"], out["t"] = _next_answer(lambda: s.generate(z.long_generate))

    pid = pid_of(c.backend)
    t = threading.Thread(target=run)
    t.start()
    time.sleep(min(0.3, base / 3))
    t0 = sigkill(pid)
    t.join()
    got = out["tokens"]
    row = Row(f"backend killed mid-generate({z.long_generate})", out["error"], _lost([s], [len(p) + len(got)]),
              *_recomputed([s]), out["t"] - t0, base, got == want)
    s.close()
    return row


def backend_mid_append(c: FaultCluster, z: Sizes) -> Row:
    p, more = prompt(z.prompt, 2), prompt(z.long_append, 3)[1:]
    plain = SessionPolicy(kind="none")
    ref = c.manager.open_session(backend="bench", policy=plain)
    ref.append(p)
    _, base = _timed(lambda: ref.append(more))
    want = ref.generate(z.tokens)
    ref.close()
    s = c.manager.open_session(backend="bench", policy=plain)
    s.append(p)
    out: dict[str, Any] = {}

    def run() -> None:
        _, out["error"], out["t"] = _next_answer(lambda: s.append(more))

    pid = pid_of(c.backend)
    t = threading.Thread(target=run)
    t.start()
    time.sleep(min(0.05, base / 3))
    t0 = sigkill(pid)
    t.join()
    got = s.generate(z.tokens)
    row = Row(f"backend killed mid-append({len(more)})", out["error"],
              _lost([s], [len(p) + len(more) + len(got)]), *_recomputed([s]), out["t"] - t0, base, got == want,
              "token count exact: " + str(s.stats()["token_count"] == len(p) + len(more) + len(got)))
    s.close()
    return row


def backend_while_suspended(c: FaultCluster, z: Sizes) -> Row:
    return _killed_while_suspended(c, z, "backend", lambda: c.backend, "resume imports the parked blocks")


def store_while_suspended(c: FaultCluster, z: Sizes) -> Row:
    """The resume needs nothing from the dead store: the backend still holds the parked blocks in
    its write-behind stage (the store only hears, later, that it may drop them)."""
    return _killed_while_suspended(c, z, "cold store", lambda: c.store, "resume served by the write-behind stage")


def _killed_while_suspended(c: FaultCluster, z: Sizes, who: str, actor: Callable[[], Any], note: str) -> Row:
    p = prompt(z.prompt, 4)
    ref = c.manager.open_session(backend="bench")
    ref.append(p)
    ref.generate(8)
    ref.suspend()
    wait_parked(c.store, ref.session_id)
    _, base = _timed(ref.resume)
    want = ref.generate(z.tokens)
    ref.close()
    s = c.manager.open_session(backend="bench")
    s.append(p)
    s.generate(8)
    s.suspend()
    wait_parked(c.store, s.session_id)
    old = pid_of(actor())
    t0 = sigkill(old)
    _, error, t1 = _next_answer(s.resume)
    got = s.generate(z.tokens)
    row = Row(f"{who} killed while suspended", error, _lost([s], [len(p) + 8 + len(got)]), *_recomputed([s]),
              t1 - t0, base, got == want, note)
    s.close()
    wait_restarted(actor(), old)  # the next scenario starts with every actor up
    return row


def store_during_resume(c: FaultCluster, z: Sizes) -> Row:
    """Four suspended sessions of a restarted backend (so their resumes read the store) resumed
    from four threads as the store is killed."""
    p = prompt(z.prompt, 5)

    def suspended(n: int) -> list[Any]:
        out = []
        for _ in range(n):
            s = c.manager.open_session(backend="bench")
            s.append(p)
            s.generate(8)
            s.suspend()
            out.append(s)
        for s in out:
            wait_parked(c.store, s.session_id)
        old = pid_of(c.backend)
        sigkill(old)
        wait_restarted(c.backend, old)
        return out

    def resume_all(sessions: list[Any], fault: Callable[[], float] | None) -> tuple[float, list[str]]:
        go = threading.Barrier(len(sessions) + 1)
        errors: list[str] = []

        def run(s: Any) -> None:
            go.wait()
            _, error, _ = _next_answer(s.resume)
            if error != "none":
                errors.append(error)

        threads = [threading.Thread(target=run, args=(s,)) for s in sessions]
        for t in threads:
            t.start()
        go.wait()
        t0 = fault() if fault is not None else time.monotonic()
        for t in threads:
            t.join()
        return time.monotonic() - t0, errors

    refs = suspended(4)
    base, _ = resume_all(refs, None)
    want = [r.generate(z.tokens) for r in refs]
    for r in refs:
        r.close()
    sessions = suspended(4)
    pid = pid_of(c.store)
    recover, errors = resume_all(sessions, lambda: sigkill(pid))
    got = [s.generate(z.tokens) for s in sessions]
    row = Row("cold store killed during 4 resumes", errors[0] if errors else "none",
              _lost(sessions, [len(p) + 8 + len(g) for g in got]), *_recomputed(sessions), recover, base, got == want,
              "all live: " + str(all(s.stats()["state"] == "live" for s in sessions)))
    for s in sessions:
        s.close()
    wait_restarted(c.store, pid)
    return row


def planner_killed(c: FaultCluster, z: Sizes) -> Row:
    p = prompt(z.prompt // 2, 6)
    first = c.manager.open_session(policy=SessionPolicy())
    first.append(p)

    def open_and_append() -> Any:
        s = c.manager.open_session(policy=SessionPolicy())
        s.append(p)
        return s

    ref, base = _timed(open_and_append)
    want = ref.generate(z.tokens)
    ref.close()
    old = pid_of(c.planner)
    t0 = sigkill(old)
    other, error, t1 = _next_answer(open_and_append)
    got = other.generate(z.tokens)
    more = first.generate(8)
    row = Row("planner killed, then a new session placed", error,
              _lost([first, other], [len(p) + len(more), len(p) + len(got)]), *_recomputed([first, other]),
              t1 - t0, base, got == want,
              "directory kept: " + str(c.manager.session(first.session_id).backend == first.backend))
    first.close()
    other.close()
    wait_restarted(c.planner, old)
    return row


# ---- calls that fail, disks that fill, files that rot --------------------------------------------


def append_past_budget(c: FaultCluster, z: Sizes) -> Row:
    """Not a death: an append of a session kvres may not evict runs past the backend budget after
    some chunks were decoded (a pinned session keeps half the budget; the session alone could hold
    the call). The driver sees the typed error; nothing of the call is committed."""
    from kvres.actors.host.backend import BackendFullError

    p = prompt(z.prompt, 7)
    plain = SessionPolicy(kind="none")
    ref = c.manager.open_session(backend="bench", policy=plain)
    ref.append(p)
    want, base = _timed(lambda: ref.generate(z.tokens))
    ref.close()
    pinned = c.manager.open_session(backend="bench", policy=plain.with_retention(pin=True))
    pinned.append(prompt(KV_BUDGET // 2, 9)[1:])
    s = c.manager.open_session(backend="bench", policy=plain)
    s.append(p)
    error = "none"
    try:
        s.append(prompt(KV_BUDGET - len(p) - 10, 8)[1:])  # fits the session, not beside the pinned one
    except BackendFullError as exc:
        error = type(exc).__name__
    pinned.close()
    t0 = time.monotonic()
    got, _, t1 = _next_answer(lambda: s.generate(z.tokens))
    row = Row("append past the backend budget (no kill)", error, _lost([s], [len(p) + len(got)]),
              *_recomputed([s]), t1 - t0, base, got == want,
              "rolled back: " + str(_counter(s, "rollbacks") == 1))
    s.close()
    return row


def damaged_files(c: FaultCluster, z: Sizes) -> Row:
    """Block files of suspended sessions on the disk tier damaged one way each (two sessions'
    files swapped), then the backend killed so the resumes read them: the time is from the kill
    to the last resume's answer."""
    cases = [*DAMAGES, "swapped"]
    prompts = [prompt(z.prompt, 10 + i) for i in range(len(cases))]

    def sessions() -> list[Any]:
        out = []
        for q in prompts:
            s = c.manager.open_session(backend="bench")
            s.append(q)
            s.generate(8)
            s.suspend()
            out.append(s)
        for s in out:
            wait_parked(c.store, s.session_id)
        return out

    refs = sessions()
    _, base = _timed(lambda: [r.resume() for r in refs])
    want = [r.generate(z.tokens) for r in refs]
    for r in refs:
        r.close()
    damaged = sessions()
    files = [block_files(c, s.session_id)[0] for s in damaged]
    for how, path in zip(DAMAGES, files, strict=False):
        if how != "swapped":
            damage(path, how)
    damage(files[-2], "swapped", files[-1])
    t0 = sigkill(pid_of(c.backend))
    errors = [e for e in (_next_answer(s.resume)[1] for s in damaged) if e != "none"]
    t1 = time.monotonic()
    got = [s.generate(z.tokens) for s in damaged]
    row = Row("block files damaged (" + ", ".join(DAMAGES) + "), backend killed", errors[0] if errors else "none",
              _lost(damaged, [len(q) + 8 + len(g) for q, g in zip(prompts, got, strict=True)]), *_recomputed(damaged),
              t1 - t0, base, got == want,
              "imported none: " + str(all(_counter(s, "admissions") == 0 for s in damaged)))
    for s in damaged:
        s.close()
    return row


def disk_full(c: FaultCluster, z: Sizes) -> Row:
    """The disk tier's file system full (a tmpfs filled with a ballast file): a streaming session
    spills on every append, a plain one is suspended, then the backend is killed (its write-behind
    copies die with it): the plain session's resume recomputes. Time: kill to the resume's answer."""
    streaming = SessionPolicy.streaming(96, recent_tokens=32)
    plain = SessionPolicy(kind="none")
    turns = (prompt(z.prompt, 20), prompt(200, 21)[1:], prompt(40, 22)[1:])
    p = prompt(z.prompt, 23)
    if not c.tmpfs:
        raise RuntimeError("the disk-full scenario fills its disk: it runs only on a tmpfs of its own")

    def run_streaming(s: Any) -> list[Any]:
        return [s.append(turns[0]), s.append(turns[1]), s.generate(16), s.append(turns[2]), s.generate(16)]

    ref = c.manager.open_session(backend="bench", policy=streaming)
    want_streaming = run_streaming(ref)
    ref.close()
    ref = c.manager.open_session(backend="bench", policy=plain)
    ref.append(p)
    ref.generate(8)
    ref.suspend()
    wait_parked(c.store, ref.session_id)
    _, base = _timed(ref.resume)
    want_plain = ref.generate(z.tokens)
    ref.close()

    ballast = fill(c.disk_dir)
    try:
        s = c.manager.open_session(backend="bench", policy=streaming)
        same = run_streaming(s) == want_streaming
        q = c.manager.open_session(backend="bench", policy=plain)
        q.append(p)
        q.generate(8)
        q.suspend()
        q.stats()  # answered after the store's (failed) write of the suspend
        t0 = sigkill(pid_of(c.backend))
        _, error, t1 = _next_answer(q.resume)
        got = q.generate(z.tokens)
    finally:
        ballast.unlink()
    row = Row("disk full under spills and a suspend, backend killed", error,
              _lost([s, q], [sum(map(len, turns)) + 32, len(p) + 8 + len(got)]), *_recomputed([q]),
              t1 - t0, base, same and got == want_plain)
    s.close()
    q.close()
    return row


def streaming_inexact(c: FaultCluster, z: Sizes) -> Row:
    """A streaming session that evicted with re-basing, its backend killed: its resident KV is
    recomputed without the context it was computed with. The divergence, if any, is reported
    (``inexact_recomputed_tokens``, a warning in the backend's log)."""
    policy = SessionPolicy.streaming(128, recent_tokens=32)
    p = prompt(max(z.prompt, 200), 30)
    ref = c.manager.open_session(backend="bench", policy=policy)
    ref.append(p)
    ref.generate(8)
    want, base = _timed(lambda: ref.generate(z.tokens))
    ref.close()
    s = c.manager.open_session(backend="bench", policy=policy)
    s.append(p)
    s.generate(8)
    t0 = sigkill(pid_of(c.backend))
    got, error, t1 = _next_answer(lambda: s.generate(z.tokens))
    recomputed, inexact = _recomputed([s])
    same = got == want
    row = Row("re-based streaming session, backend killed", error, _lost([s], [len(p) + 8 + len(got)]),
              recomputed, inexact, t1 - t0, base, same,
              "identical" if same else f"diverged at token {_first_difference(got, want)} of {len(got)}; "
              f"reported: {inexact > 0}")
    s.close()
    return row


def _first_difference(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


SCENARIOS: dict[str, Callable[[FaultCluster, Sizes], Row]] = {
    "backend-between-calls": backend_between_calls,
    "backend-mid-generate": backend_mid_generate,
    "backend-mid-append": backend_mid_append,
    "backend-while-suspended": backend_while_suspended,
    "store-while-suspended": store_while_suspended,
    "store-during-resume": store_during_resume,
    "planner": planner_killed,
    "append-past-budget": append_past_budget,
    "damaged-files": damaged_files,
    "disk-full": disk_full,
    "streaming-inexact": streaming_inexact,
}
QUICK = ("backend-between-calls", "store-while-suspended", "planner", "append-past-budget", "damaged-files")
