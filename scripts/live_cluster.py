"""What the operator scripts share: Debian packages on demand, and a live kvres cluster with traffic.

Primitives:
- ``ensure_binary(binary, package) -> str``: the binary's path, installing the Debian package with
  ``apt-get`` first when it is missing (``apt-get update`` once before).
- ``free_port() -> int``.
- ``start_cluster(namespace, metrics_port, **ray_init) -> SessionManager``: a local Ray cluster with
  kvres on the project's passkey model: ``backend-0`` (room for everything) and ``small`` (four
  sequence slots, 320 tokens, so sessions get suspended to make room); a cold store of 256 KiB RAM
  and 128 KiB disk, less than what spills, so it drops blocks.
- ``drive(manager, pause=None) -> dict``: traffic that moves every number the Grafana dashboard shows: a
  streaming session grown past its budget (evictions, spills), suspended and resumed on request
  (admissions), then streamed (time to first token, gaps between tokens) and truncated back to a
  commit point (its resident layout restored); a SnapKV session's second turn; a passkey question that recalls spilled blocks, on a disk
  tier too small for what spills (store drops, blocks sessions find gone); the SnapKV session then
  suspended and resumed; sessions on ``small`` (one suspended to make room, then brought back by a
  call of its own), generated tokens. The sessions stay open; returns them with how many tokens
  were generated and streamed and how many generate / stream calls were made.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
MODEL = REPO / "models" / "passkey.gguf"
PROMPT = [3 + (i * 7) % 120 for i in range(200)]  # token ids inside the passkey vocabulary
RAM_BUDGET = 256 << 10
DISK_BUDGET = 128 << 10


def ensure_binary(binary: str, package: str) -> str:
    found = shutil.which(binary)
    if found:
        return found
    print(f"installing the Debian package {package!r} (for {binary!r}) with apt-get", file=sys.stderr)
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run(["apt-get", "update"], check=True, env=env, stdout=subprocess.DEVNULL)
    subprocess.run(["apt-get", "install", "-y", "--no-install-recommends", package], check=True, env=env,
                   stdout=subprocess.DEVNULL)
    found = shutil.which(binary)
    if not found:
        raise SystemExit(f"{package!r} installed, but no {binary!r} on PATH")
    return found


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_cluster(namespace: str, metrics_port: int, **ray_init: Any) -> Any:
    os.environ.setdefault("RAY_metrics_report_interval_ms", "1000")  # noqa: SIM112 (Ray's own name)
    from kvres.cluster import BackendConfig, ColdStoreConfig, KvresConfig, TenantQuota, connect

    config = KvresConfig(
        backends=[
            # a tenant allowed 250 resident tokens and no cold storage: its parked sessions recompute
            BackendConfig(name="backend-0", model_path=MODEL, n_ctx=2048, n_seq_max=6, kv_budget_tokens=2000,
                          n_threads=1, tenant_quotas={"ops-tenant": TenantQuota(resident_tokens=250, cold_bytes=0)}),
            BackendConfig(name="small", model_path=MODEL, n_ctx=1024, n_seq_max=4, kv_budget_tokens=320,
                          n_threads=1),
        ],
        # a disk tier smaller than what spills: the store drops blocks, their sessions recompute them
        cold_store=ColdStoreConfig(ram_budget_bytes=RAM_BUDGET, disk_budget_bytes=DISK_BUDGET),
    )
    return connect(namespace=namespace, config=config, _metrics_export_port=metrics_port, **ray_init)


def drive(manager: Any, pause: Callable[[], None] | None = None) -> dict[str, Any]:
    """``pause``: called once between the first session's calls and the rest (a scraper catches
    every series there, so the rest shows as a rate, not as a series born at its final value)."""
    from kvres.cluster import SessionPolicy

    calls = {"generate": 0, "stream": 0}
    streaming = manager.open_session(policy=SessionPolicy.streaming(128, recent_tokens=32), backend="backend-0",
                                     session_id="ops-streaming")
    streaming.append(PROMPT)
    generated = len(streaming.generate(96))
    mark = len(PROMPT) + generated  # a commit point: a truncate back to it restores its resident layout
    streaming.suspend()  # explicit suspend and resume
    streaming.resume()
    generated += len(streaming.generate(32))
    streamed = len(list(streaming.stream(24, ignore_eos=True)))  # time to first token, gaps between tokens
    generated += streamed
    calls["generate"] += 2
    calls["stream"] += 1
    if pause is not None:
        pause()
    scored = manager.open_session(policy=SessionPolicy.scored(128, scorer="snapkv", recent_tokens=32),
                                  backend="backend-0", session_id="ops-snapkv")
    scored.append(PROMPT)
    generated += len(scored.generate(48))
    scored.append(PROMPT[:60])  # a second turn
    generated += len(scored.generate(8))
    calls["generate"] += 2
    # a second stream: a histogram series first seen with a single observation has no rate to plot
    second = len(list(streaming.stream(8, ignore_eos=True)))
    streamed += second
    generated += second
    calls["stream"] += 1
    recall = _recall_turn(manager)  # a passkey question that brings spilled blocks back: recalls
    generated += recall["generated"]
    calls["generate"] += 1
    scored.suspend()  # parked in a store that has dropped blocks, and brought back
    scored.resume()
    # a truncate back to a commit point brings that point's resident layout back (from the store, or
    # recomputed from the log where the store dropped it)
    streaming.truncate(mark)
    idle = manager.open_session(backend="small", session_id="ops-idle")
    idle.append(PROMPT[:180])
    busy = manager.open_session(backend="small", policy=SessionPolicy.streaming(200, recent_tokens=32),
                                session_id="ops-busy")
    busy.append(PROMPT[:150])  # idle is suspended to make room (a forced suspend)
    extra = manager.open_session(backend="small", session_id="ops-extra")
    extra.append(PROMPT[:20])
    idle.append(PROMPT[:10])  # a call for the suspended session brings it back (an implicit resume)
    tenant = SessionPolicy().with_retention(tenant="ops-tenant")
    first = manager.open_session(backend="backend-0", policy=tenant, session_id="ops-tenant-1")
    first.append(PROMPT[:120])
    second = manager.open_session(backend="backend-0", policy=tenant, session_id="ops-tenant-2")
    second.append(PROMPT[:150])  # over the tenant's 250: its first session is suspended, its state dropped
    first.append(PROMPT[:10])  # and recomputed from its log when it is called again
    return {"sessions": [streaming, scored, recall["session"], idle, busy, extra, first, second],
            "generated_tokens": generated,
            "streamed_tokens": streamed, "calls": calls}


def _recall_turn(manager: Any) -> dict[str, Any]:
    """A passkey task in a spilling SnapKV session of a tenth of its length: the question's
    attention brings the passkey's spilled blocks back (``kvres.actors.host.spill_recall``)."""
    sys.path.insert(0, str(REPO))
    from benchmarks.passkey import harness, sessions
    from models import passkey_tasks

    task = passkey_tasks.fixed_task_set(1, 1, seed=0, n_tokens=(300, 394), depth=(1 / 3, 2 / 3))[0]
    policy = sessions.policy_for("snapkv", task, 0.10, harness.EvalConfig())
    assert policy is not None
    session = manager.open_session(policy=policy.model_copy(update={"spill": True}), backend="backend-0",
                                   session_id="ops-recall")
    q0 = task.question_span[0]
    session.append(task.prompt_ids[:q0])
    session.append(task.prompt_ids[q0:])
    return {"session": session, "generated": len(session.generate(len(task.answer_ids)))}
