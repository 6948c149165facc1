"""Plan time, new path against the old one in the same run: ``plan_hot_set`` from 100 to 1,000,000
blocks, ``plan_backend`` for 8 sessions x 64 blocks, and a session that grew by one block.

Run: ``.venv/bin/python -m benchmarks.plan_scaling [--out DIR] [--max-blocks N] [--actor]``
Writes ``plan_scaling.json`` and ``plan_scaling.png`` into ``DIR`` (default benchmarks/results).

- ``rows``: each size planned with streaming + scores (the heaviest path) from a ``BlockTable``,
  by the new planner (partial selection), by the old one (``legacy.py``: a full sort) and from a
  list of ``Block`` objects; the growth exponent is the slope of log(time) against log(blocks),
  fitted on the new table path.
- ``backend``: ``plan_backend`` for one backend of 8 sessions of 1,024 resident tokens, every one
  over its 512-token budget (64 blocks of 16 each): all streaming; the active one scored (what a
  backend plans: it scores only the session it serves); all scored; and the steady state of
  batched decoding, 8 sessions each one block over its budget.
- ``incremental``: one streaming session of N blocks that grew by one block past its budget: the
  new path walks its ranges (flat in N), the old one rebuilt and sorted every block (linear).
- ``actor`` (with ``--actor``): the old path, every plan through one planner actor from 4
  concurrent callers (as 4 backends did), against the new in-process plan.
- ``acceptance``: the issue's bounds, 8 x 64 under 0.5 ms, 62,500 blocks under 10 ms.

Times are medians of many repeats; ratios are old / new from the same run.
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from kvres.policy import Capabilities, PlanInput, Range, StreamPolicy, plan_hot_set
from kvres.policy.backend_planner import BackendPlanInput, SessionView, plan_backend
from kvres.policy.blocks import BlockTable

from .legacy import legacy_plan_backend, legacy_plan_hot_set

CAPS = Capabilities(remove_middle=True, position_shift=True)
BLOCK = 16
STREAM = StreamPolicy(True, 4, 64)


def median_seconds(fn: Callable[[], object], repeats: int) -> float:
    fn()  # warm
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def hot_set_input(n: int, as_objects: bool = False) -> PlanInput:
    table = BlockTable.uniform(Range(0, n * BLOCK), BLOCK)
    scores = np.random.default_rng(n).random(n)
    budget = n * BLOCK // 4
    return PlanInput(table.to_blocks() if as_objects else table, budget,
                     StreamPolicy(True, 4, min(1024, budget // 2)), CAPS, scores)


def time_plan(n: int, repeats: int, as_objects: bool, legacy: bool = False) -> float:
    inp = hot_set_input(n, as_objects)
    planner = legacy_plan_hot_set if legacy else plan_hot_set
    plan = planner(inp)
    assert plan.hot_tokens <= inp.budget_tokens
    return median_seconds(lambda: planner(inp), repeats)


def backend_input(case: str) -> BackendPlanInput:
    """8 sessions of 64 blocks (``steady``: of 65 blocks, one over a 1,024-token budget)."""
    rng = np.random.default_rng(8)
    views = []
    for i in range(8):
        steady = case == "steady"
        tokens, budget = (1024 + BLOCK, 1024) if steady else (1024, 512)
        scored = case == "all_scored" or (case == "one_scored" and i == 7)
        n_blocks = -(-tokens // BLOCK)
        views.append(SessionView(
            f"s{i}", (Range(0, tokens),), last_used=i, active=i == 7, incoming_tokens=0,
            budget_tokens=budget, stream_policy=STREAM, evictable=True, block_size=BLOCK,
            scores=tuple(rng.random(n_blocks).tolist()) if scored else None,
        ))
    return BackendPlanInput(views, 8 * 2048, CAPS)


def grown_session(n_blocks: int) -> BackendPlanInput:
    """One streaming session of ``n_blocks`` blocks that just grew one block past its budget."""
    tokens = n_blocks * BLOCK
    view = SessionView("s", (Range(0, tokens + BLOCK),), 1, active=True, budget_tokens=tokens,
                       stream_policy=STREAM, evictable=True, block_size=BLOCK)
    return BackendPlanInput([view], tokens * 2, CAPS)


def time_backend(inp: BackendPlanInput, repeats: int) -> dict[str, float]:
    new, old = plan_backend(inp), legacy_plan_backend(inp)
    assert new.resident_after == old.resident_after or any(v.scores for v in inp.sessions)
    new_s = median_seconds(lambda: plan_backend(inp), repeats)
    old_s = median_seconds(lambda: legacy_plan_backend(inp), repeats)
    return {"new_ms": new_s * 1e3, "legacy_ms": old_s * 1e3, "speedup": old_s / new_s}


def time_actor(inp: BackendPlanInput, callers: int, seconds: float) -> dict[str, float]:
    """Plans through one planner actor from ``callers`` threads (the old path), per plan."""
    import ray

    from kvres.actors.ray_actors.planner_actor import PlannerActor

    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        planner = PlannerActor.options(num_cpus=0).remote()
        ray.get(planner.plan.remote("b", inp))
        latencies: list[float] = []
        lock = threading.Lock()
        stop = time.perf_counter() + seconds

        def caller() -> None:
            mine = []
            while time.perf_counter() < stop:
                t0 = time.perf_counter()
                ray.get(planner.plan.remote("b", inp))
                mine.append(time.perf_counter() - t0)
            with lock:
                latencies.extend(mine)

        threads = [threading.Thread(target=caller) for _ in range(callers)]
        t0 = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        elapsed = time.perf_counter() - t0
        ray.kill(planner)
    finally:
        if started:
            ray.shutdown()
    in_process = median_seconds(lambda: plan_backend(inp), 300)
    return {
        "callers": callers, "plans_per_s": len(latencies) / elapsed,
        "latency_ms": float(np.median(latencies)) * 1e3, "in_process_ms": in_process * 1e3,
        "in_process_plans_per_s": 1.0 / in_process,
    }


def main(argv: list[str] | None = None) -> dict[str, object]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    parser.add_argument("--max-blocks", type=int, default=1_000_000)
    parser.add_argument("--repeats", type=int, default=200, help="repeats of each small plan")
    parser.add_argument("--actor", action="store_true", help="also time plans through the planner actor")
    args = parser.parse_args(argv)

    sizes = [n for n in (100, 1_000, 10_000, 62_500, 100_000, 1_000_000) if n <= args.max_blocks]
    rows = []
    for n in sizes:
        repeats = 3 if n >= 100_000 else 9
        seconds = time_plan(n, repeats, as_objects=False)
        legacy = time_plan(n, repeats, as_objects=False, legacy=True)
        objects = time_plan(n, max(1, repeats // 3), as_objects=True)
        rows.append({"blocks": n, "tokens": n * BLOCK, "plan_ms": seconds * 1e3, "plan_ms_legacy": legacy * 1e3,
                     "plan_ms_from_objects": objects * 1e3, "speedup": legacy / seconds})
        print(f"plan_hot_set {n:>9} blocks  {seconds * 1e3:9.3f} ms  (old {legacy * 1e3:9.3f} ms, "
              f"x{legacy / seconds:5.1f}; from objects {objects * 1e3:9.2f} ms)")
    big = [r for r in rows if r["blocks"] >= 1_000]
    slope = float(np.polyfit(np.log([r["blocks"] for r in big]), np.log([r["plan_ms"] for r in big]), 1)[0]) \
        if len(big) >= 2 else None

    backend = {}
    for case in ("streaming", "one_scored", "all_scored", "steady"):
        backend[case] = time_backend(backend_input(case), args.repeats)
        b = backend[case]
        print(f"plan_backend 8 x 64 {case:<11} {b['new_ms']:7.3f} ms  (old {b['legacy_ms']:7.3f} ms, "
              f"x{b['speedup']:5.1f})")
    incremental = []
    for n in (64, 1_000, 10_000, 62_500):
        if n > args.max_blocks:
            continue
        t = time_backend(grown_session(n), args.repeats if n <= 1_000 else max(5, args.repeats // 20))
        incremental.append({"blocks": n, **t})
        print(f"grown by one block, {n:>6} blocks: {t['new_ms']:7.3f} ms  (old {t['legacy_ms']:8.3f} ms)")
    result: dict[str, Any] = {
        "rows": rows, "growth_exponent": slope, "block_size": BLOCK, "backend": backend,
        "incremental": incremental,
    }
    if args.actor:
        result["actor"] = time_actor(backend_input("streaming"), callers=4, seconds=5.0)
        a = result["actor"]
        print(f"through the planner actor, 4 callers: {a['plans_per_s']:.0f} plans/s, {a['latency_ms']:.2f} ms "
              f"per plan; in process {a['in_process_plans_per_s']:.0f} plans/s")
    at_62500 = next((r["plan_ms"] for r in rows if r["blocks"] == 62_500), None)
    result["acceptance"] = {
        "plan_backend_8x64_ms": backend["streaming"]["new_ms"],
        "plan_backend_8x64_one_scored_ms": backend["one_scored"]["new_ms"], "plan_backend_bound_ms": 0.5,
        "plan_hot_set_62500_ms": at_62500, "plan_hot_set_bound_ms": 10.0,
    }
    print(f"growth exponent {slope:.2f}" if slope is not None else "growth exponent: too few sizes")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "plan_scaling.json").write_text(json.dumps(result, indent=2))
    plot(result, args.out / "plan_scaling.png")
    return result


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, middle, right) = plt.subplots(1, 3, figsize=(15, 4.2))
    rows = result["rows"]
    blocks = [r["blocks"] for r in rows]
    left.loglog(blocks, [r["plan_ms"] for r in rows], "o-", label="new (BlockTable)")
    left.loglog(blocks, [r["plan_ms_legacy"] for r in rows], "x--", label="old (BlockTable)")
    left.loglog(blocks, [r["plan_ms_from_objects"] for r in rows], "s:", label="new, list of Block")
    left.axhline(10.0, color="grey", lw=0.8)
    left.set_xlabel("blocks (16 tokens each)")
    left.set_ylabel("plan_hot_set time (ms, median)")
    slope = result["growth_exponent"]
    left.set_title("plan_hot_set, streaming + scores" + (f"; exponent {slope:.2f}" if slope else ""))
    left.legend()
    cases = list(result["backend"])
    x = np.arange(len(cases))
    middle.bar(x - 0.2, [result["backend"][c]["legacy_ms"] for c in cases], 0.4, label="old")
    middle.bar(x + 0.2, [result["backend"][c]["new_ms"] for c in cases], 0.4, label="new")
    middle.axhline(0.5, color="grey", lw=0.8)
    middle.set_xticks(x, cases)
    middle.set_ylabel("plan_backend time (ms, median)")
    middle.set_title("one backend, 8 sessions x 64 blocks")
    middle.legend()
    inc = result["incremental"]
    right.loglog([r["blocks"] for r in inc], [r["legacy_ms"] for r in inc], "x--", label="old: full re-plan")
    right.loglog([r["blocks"] for r in inc], [r["new_ms"] for r in inc], "o-", label="new: from ranges")
    right.set_xlabel("session size (blocks)")
    right.set_ylabel("plan time (ms, median)")
    right.set_title("a session grown by one block")
    right.legend()
    for ax in (left, middle, right):
        ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


if __name__ == "__main__":
    main()
