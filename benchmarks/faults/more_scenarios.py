"""Fault scenarios beyond one actor's death: a stream left by its consumer, a driver killed
mid-call, bad arguments (on the benchmark's cluster), and a node death and head restarts (each on
a cluster of its own).

Primitives:
- ``abandoned_stream(cluster, sizes) -> Row``, ``driver_killed(cluster, sizes) -> Row``,
  ``bad_arguments(cluster, sizes) -> Row``: ``scenarios.SCENARIOS``-style.
- ``ON_CLUSTER``: those three by name; ``SOLO``: name -> ``(model, sizes, tmp) -> Row`` for the scenarios that bring their own cluster:
  "node-death" (``node_death``), "head-restart-ft" (``head_restart`` with an external Redis),
  "head-restart-no-ft" (without GCS fault tolerance: every session is lost, and the row says
  whether the user was told and the earlier run's folders were removed).
"""

from __future__ import annotations

import gc
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pydantic

from kvres.actors.host.refusals import SessionBusyError
from kvres.policy import KvresError

from .cluster import FaultCluster, pid_of
from .scenarios import Row, Sizes, _lost, _recomputed, _timed, prompt

ROOT = Path(__file__).resolve().parents[2]


def abandoned_stream(c: FaultCluster, z: Sizes) -> Row:
    """A stream of ``long_generate`` tokens dropped after 5: the backend stops, keeps those 5."""
    p = prompt(z.prompt, 5)
    ref = c.manager.open_session(backend="bench")
    ref.append(p)
    ref.generate(5, ignore_eos=True)
    want, base = _timed(lambda: list(ref.generate(z.tokens, ignore_eos=True)))
    ref.close()
    s = c.manager.open_session(backend="bench")
    s.append(p)
    stream = s.stream(z.long_generate, ignore_eos=True)
    for _ in range(5):
        next(stream)
    t0 = time.monotonic()
    del stream  # the consumer goes away without closing it
    gc.collect()
    got = list(_when_free(lambda: s.generate(z.tokens, ignore_eos=True)))
    t1 = time.monotonic()
    log = s.tokens()
    row = Row("stream abandoned by its consumer", "none", _lost([s], [len(p) + 5 + len(got)]), *_recomputed([s]),
              t1 - t0, base, got == want and len(log) == len(p) + 5 + len(got),
              note=f"committed {len(log) - len(p) - len(got)} of the {z.long_generate} asked (5 handed out)")
    s.close()
    return row


def _when_free(call: Callable[[], Any], timeout_s: float = 120.0) -> Any:
    """``call()`` once the session's running call (an orphan's) has ended."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return call()
        except SessionBusyError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


DRIVER = """
import json, os, sys, threading
from kvres.cluster import KvresConfig, connect
config = KvresConfig.model_validate_json(sys.argv[3])
m = connect(address=sys.argv[1], namespace=sys.argv[2], config=config)
s = m.open_session(session_id=sys.argv[4], backend="bench")
s.append(json.loads(sys.argv[5]))
print("go", flush=True)
s.generate(int(sys.argv[6]), ignore_eos=True)
print("done", flush=True)
"""


def driver_killed(c: FaultCluster, z: Sizes) -> Row:
    """Another driver's ``generate(long_generate)`` whose driver is SIGKILLed a third into it: the
    backend finishes and commits it; this driver reads the session's log and goes on."""
    import ray

    p = prompt(z.prompt, 6)
    ref = c.manager.open_session(backend="bench")
    ref.append(p)
    orphan_tokens = list(ref.generate(z.long_generate, ignore_eos=True))
    want, base = _timed(lambda: list(ref.generate(z.tokens, ignore_eos=True)))
    ref.close()
    sid = f"orphan-{uuid.uuid4().hex[:8]}"
    args = [sys.executable, "-c", DRIVER, str(ray.get_runtime_context().gcs_address), c.manager.namespace,
            c.manager.config.model_dump_json(), sid, json.dumps(p), str(z.long_generate)]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd=ROOT)
    assert proc.stdout is not None
    line = proc.stdout.readline().strip()
    time.sleep(0.3 * base * z.long_generate / z.tokens)  # about a third into its generate
    os.kill(proc.pid, signal.SIGKILL)
    t0 = time.monotonic()
    rest = proc.communicate()[0]
    if line != "go":
        raise RuntimeError(f"the driver to kill did not start its call (it printed {line!r})")
    s = c.manager.session(sid)
    got = list(_when_free(lambda: s.generate(z.tokens, ignore_eos=True)))
    t1 = time.monotonic()
    log = s.tokens()
    committed = len(log) - len(p) - len(got)
    same = log[: len(p) + committed] == (p + orphan_tokens)[: len(p) + committed]
    same = same and (committed < z.long_generate or got == want)
    row = Row("driver killed mid-call", "none", _lost([s], [len(p)]), *_recomputed([s]), t1 - t0, base, same,
              note=f"the orphaned call committed {committed} of {z.long_generate} tokens, readable with "
                   f"Session.tokens()" + ("; it had finished before the kill" if "done" in rest else ""))
    s.close()
    return row


def bad_arguments(c: FaultCluster, z: Sizes) -> Row:
    """Calls with arguments no engine may see: each must be refused with a kvres error (or pydantic's
    ``ValidationError`` naming the field), the backend
    must not crash (same pid), the session must go on as if they had not been made."""
    p = prompt(z.prompt, 7)
    ref = c.manager.open_session(backend="bench")
    ref.append(p)
    want, base = _timed(lambda: list(ref.generate(z.tokens, ignore_eos=True)))
    ref.close()
    s = c.manager.open_session(backend="bench")
    s.append(p)
    pid = pid_of(c.backend)
    calls: list[Callable[[], Any]] = [
        lambda: s.append(None), lambda: s.append(5), lambda: s.append([]), lambda: s.append([10**6]),
        lambda: s.append([-1]), lambda: s.append(b"bytes"), lambda: s.generate(2.5), lambda: s.generate(True),
        lambda: s.generate("3"), lambda: s.generate(-1), lambda: s.generate(4, seed=-1),
        lambda: s.generate(4, temperature=-1.0), lambda: s.generate(4, top_k="x"), lambda: s.detokenize([10**6]),
        lambda: s.detokenize([-1]), lambda: s.detokenize([2**40]), lambda: s.truncate(-1),
        lambda: s.truncate(10**9), lambda: s.rollback(True), lambda: s.rollback(10**9),
        lambda: s.stream(-1), lambda: s.migrate(5), lambda: s.export(5), lambda: s.detokenize("abc"),
    ]
    typed = untyped = 0
    kinds: list[str] = []
    t0 = time.monotonic()
    for call in calls:
        try:
            call()
            untyped += 1  # accepted: not a refusal
            kinds.append("accepted")
        except (KvresError, pydantic.ValidationError):  # a ValidationError names the field and value
            typed += 1
        except Exception as exc:
            untyped += 1
            kinds.append(type(exc).__name__)
    got = list(s.generate(z.tokens, ignore_eos=True))
    t1 = time.monotonic()
    crashed = pid_of(c.backend) != pid
    row = Row("bad arguments", "none" if not untyped else f"untyped: {','.join(sorted(set(kinds)))}",
              _lost([s], [len(p) + len(got)]), *_recomputed([s]), t1 - t0, base, got == want and not crashed,
              note=f"{typed} of {len(calls)} refused with a typed error; backend crashes: {int(crashed)}")
    s.close()
    return row


# ---- scenarios with a cluster of their own ---------------------------------------------------------


def _solo_row(name: str, result: dict[str, Any], note: str) -> Row:
    errors = result["errors"]
    return Row(name, errors[0].split(":", 2)[1].strip() if errors else "none", 0, 0, 0, result["recover_s"], 0.0,
               result["identical"] == result["sessions"], note=note, sessions=result["sessions"],
               sessions_lost=result["sessions_lost"], identical=result["identical"])


def node_death_row(model: str, z: Sizes, tmp: Path) -> Row:
    from .node_death import node_death

    r = node_death(model, prompt=min(z.prompt, 200), tokens=min(z.tokens, 32))
    return _solo_row("worker node removed (live, suspended, streamed, migrated, spilled there)", r,
                     f"placed after: {','.join(r['placed'])}; spilled blocks lost with the node: "
                     f"{r['spilled_blocks_before']}")


def head_restart_ft_row(model: str, z: Sizes, tmp: Path) -> Row:
    from .head_restart import head_restart

    (tmp / "ft").mkdir(parents=True, exist_ok=True)
    r = head_restart(model, "redis", tmp / "ft", prompt=min(z.prompt, 200), tokens=min(z.tokens, 32))
    return _solo_row("head restart, GCS fault tolerance (Redis)", r, f"head down and up in {r['restart_s']:.1f} s")


def head_restart_no_ft_row(model: str, z: Sizes, tmp: Path) -> Row:
    from .head_restart import head_restart

    (tmp / "noft").mkdir(parents=True, exist_ok=True)
    r = head_restart(model, None, tmp / "noft", prompt=min(z.prompt, 200), tokens=min(z.tokens, 32))
    told = all("ClusterRestartedError" in e for e in r["errors"])
    row = _solo_row("head restart, no GCS fault tolerance", r,
                    f"user told (ClusterRestartedError): {told}; earlier run's folders left on disk: "
                    f"{len(set(r['folders_before']) & set(r['folders_after']))}")
    row.same_tokens = told and r["sessions_lost"] == r["sessions"]  # expected: lost, and said so
    return row


ON_CLUSTER: dict[str, Callable[[FaultCluster, Sizes], Row]] = {
    "abandoned-stream": abandoned_stream,
    "driver-killed": driver_killed,
    "bad-arguments": bad_arguments,
}
SOLO: dict[str, Callable[[str, Sizes, Path], Row]] = {
    "node-death": node_death_row,
    "head-restart-ft": head_restart_ft_row,
    "head-restart-no-ft": head_restart_no_ft_row,
}
