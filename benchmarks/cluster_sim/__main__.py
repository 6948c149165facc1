"""A simulated cluster: the real planner actor and placement, driven by simulated backends, and an
analytic model of the protocol extrapolated to 1,000 backends and 100,000 sessions.

Run: ``.venv/bin/python -m benchmarks.cluster_sim [--backends 200] [--seconds 20] [--out DIR]``
Writes ``cluster_sim.json`` and ``cluster_sim.png`` into ``DIR`` (default benchmarks/results).

1. Costs, each on a fresh planner actor, as CPU seconds of the planner's process per call (Ray's
   per-call work included): a pushed report; a forget; a placement with 10 to 5,000 backends in
   the view (fitted as base + slope x backends); the old path's plan (8 sessions x 64 blocks,
   every step through the planner); and the round trip of a trivial call.
2. The simulation: ``--backends`` simulated backends (``sim.py``: in-process objects in a few
   ``SimHost`` actors, two models, node labels per host) step their sessions, plan in their own
   process with the real ``plan_backend`` and push rate-limited ``LoadReport``s. Driver threads
   open ``--sessions-per-backend`` sessions per backend through ``planner.place`` + the host's
   open (what ``SessionManager.open_session`` does), then close and reopen sessions for
   ``--seconds``. Measured: open latency, reports and placements per second at the planner, its
   busy time, the old placement (one stats call per backend) on the same backends, and whether
   every session went to a backend of its model.
3. The model (``model.py``) with those costs: planner utilisation, open latency and report
   traffic from 10 to 5,000 backends at ``--sessions-per-backend-at-scale`` sessions each (100 x
   1,000 = 100,000), and where the planner saturates, new protocol and old. The model is checked
   against the simulation at its own workload (``check_at_simulated_size``) and also given with
   the planner's costs scaled by measured / predicted there (``*_calibrated``).
"""

from __future__ import annotations

import argparse
import json
import pickle
import random
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from kvres.policy import Range
from kvres.policy.backend_planner import BackendPlanInput, SessionView
from kvres.policy.placement import LoadReport, ReportLimiter
from kvres.policy.residency import EngineNeed

from .model import Costs, Workload, as_dict, open_latency_s, planner_load, saturation_backends

MODELS = ("/models/model-a.gguf", "/models/model-b.gguf")
SESSION_BUDGET = 256


def _median(xs: list[float]) -> float:
    return float(np.median(xs)) if xs else float("nan")


def _p99(xs: list[float]) -> float:
    return float(np.percentile(xs, 99)) if xs else float("nan")


def _fresh_planner() -> Any:
    from kvres.actors.ray_actors.planner_actor import PlannerActor

    planner = PlannerActor.options(num_cpus=0).remote()
    import ray

    ray.get(planner.stats.remote())
    return planner


def _synthetic(n: int) -> list[LoadReport]:
    return [LoadReport(f"b{i}", 4096, (i * 37) % 4096, live_sessions=i % 16, n_seq_max=16,
                       model=MODELS[i % 2], engine="sim", labels={"zone": f"z{i % 4}"}, at=1.0)
            for i in range(n)]


def plan_input() -> BackendPlanInput:
    views = [SessionView(f"s{i}", (Range(0, 1024),), i, i == 7, 0, 512, _stream(), True) for i in range(8)]
    return BackendPlanInput(views, 8 * 2048, _caps())


def _stream() -> Any:
    from kvres.policy import StreamPolicy

    return StreamPolicy(True, 4, 64)


def _caps() -> Any:
    from kvres.policy import Capabilities

    return Capabilities(remove_middle=True, position_shift=True)


def _cost(planner: Any, calls: int, submit: Callable[[], list[Any]]) -> tuple[float, float]:
    """(planner CPU seconds, wall seconds) per call of ``submit``'s ``calls`` calls: the CPU the
    planner's process spent, Ray's per-call work included, which is what bounds its throughput
    whatever else runs on this small machine; the wall time includes submitting from here."""
    import ray

    before = ray.get(planner.stats.remote())
    t0 = time.perf_counter()
    ray.get(submit())
    after = ray.get(planner.stats.remote())  # after every call submitted before it, from here
    return (after["cpu_s"] - before["cpu_s"]) / calls, (time.perf_counter() - t0) / calls


def measure_costs(view_sizes: list[int], calls: int, idle_s: float) -> dict[str, Any]:
    """Each cost on a fresh planner actor, from calls issued back to back by this process."""
    import ray

    planner = _fresh_planner()
    idle = ray.get(planner.stats.remote())["cpu_s"]
    time.sleep(idle_s)
    idle_cpu = (ray.get(planner.stats.remote())["cpu_s"] - idle) / idle_s  # Ray's own threads, no calls
    rtt = []
    for _ in range(min(calls, 200)):
        t0 = time.perf_counter()
        ray.get(planner.where.remote("nobody"))
        rtt.append(time.perf_counter() - t0)
    reports = [LoadReport(f"b{i % 1000}", 4096, i % 4096, n_seq_max=16, model=MODELS[0], at=time.time())
               for i in range(calls * 4)]

    def push() -> list[Any]:
        for r in reports:
            planner.report_load.remote(r)  # fire and forget, as backends push
        return []

    report_cpu, report_wall = _cost(planner, len(reports), push)
    forget_cpu, _ = _cost(planner, calls, lambda: [planner.forget.remote(f"s{i}") for i in range(calls)])
    inp = plan_input()
    plan_cpu, plan_wall = _cost(planner, calls, lambda: [planner.plan.remote("b", inp) for _ in range(calls)])
    ray.kill(planner)

    place = []
    for size in view_sizes:
        planner = _fresh_planner()
        ray.get(planner.seed.remote(_synthetic(size)))
        n = max(20, min(calls, 200_000 // size))
        cpu, wall = _cost(planner, n, lambda n=n, planner=planner: [
            planner.place.remote(f"s{i}", MODELS[i % 2], None, "streaming", SESSION_BUDGET) for i in range(n)])
        place.append({"backends": size, "cpu_s": cpu, "wall_s": wall})
        ray.kill(planner)
        print(f"  place with {size:>5} backends in the view: {cpu * 1e3:.3f} ms of planner CPU per call")
    slope, base = np.polyfit([p["backends"] for p in place], [p["cpu_s"] for p in place], 1)
    return {
        "rtt_s": _median(rtt), "report_s": report_cpu, "report_wall_s": report_wall, "forget_s": forget_cpu,
        "plan_s": plan_cpu, "plan_wall_s": plan_wall, "place": place,
        "place_base_s": max(float(base), 1e-6), "place_per_backend_s": max(float(slope), 0.0),
        "report_bytes": len(pickle.dumps(reports[0])), "idle_cpu_fraction": idle_cpu,
    }


def simulate(args: argparse.Namespace) -> dict[str, Any]:
    import ray

    from .sim import SimHost

    planner = _fresh_planner()
    limiter = {"min_interval_s": args.min_interval_ms / 1e3, "change_fraction": args.change_fraction,
               "heartbeat_s": args.heartbeat_s}
    names = [f"sim-{i}" for i in range(args.backends)]
    model_of = {n: MODELS[i % 2] for i, n in enumerate(names)}
    hosts, host_of = [], {}
    for h in range(args.hosts):
        mine = names[h::args.hosts]
        spec = [{"name": n, "model": model_of[n], "budget_tokens": args.budget_tokens, "n_seq_max": args.n_seq_max,
                 "labels": {"zone": f"z{h}"}} for n in mine]
        host = SimHost.remote(f"host-{h}", spec, planner, args.step_ms / 1e3, args.tokens_per_step, limiter)
        hosts.append(host)
        host_of.update(dict.fromkeys(mine, host))
    ray.get([h.counters.remote() for h in hosts])
    deadline = time.time() + 30
    while ray.get(planner.load.remote())["totals"]["backends"] < args.backends and time.time() < deadline:
        time.sleep(0.1)

    lock = threading.Lock()
    latencies: dict[str, list[float]] = {"fill": [], "churn": []}
    open_backend: list[float] = []
    sessions: dict[str, tuple[str, str]] = {}  # session -> (model, backend)
    errors: list[str] = []

    def open_one(phase: str, rng: random.Random) -> str:
        sid = f"s-{uuid.uuid4().hex[:12]}"
        model = rng.choice(MODELS)
        t0 = time.perf_counter()
        backend = ray.get(planner.place.remote(sid, model, None, EngineNeed.KVRES_ADDRESSED, SESSION_BUDGET))
        t1 = time.perf_counter()
        ray.get(host_of[backend].open.remote(backend, sid, SESSION_BUDGET))
        t2 = time.perf_counter()
        with lock:
            latencies[phase].append(t2 - t0)
            open_backend.append(t2 - t1)
            sessions[sid] = (model, backend)
        return sid

    def close_one(sid: str) -> None:
        with lock:
            _, backend = sessions.pop(sid)
        ray.get(host_of[backend].close.remote(backend, sid))
        ray.get(planner.forget.remote(sid))

    target = args.backends * args.sessions_per_backend

    def fill(worker: int) -> None:
        rng = random.Random(worker)
        for _ in range(target // args.drivers):
            try:
                open_one("fill", rng)
            except Exception as e:  # noqa: BLE001 (reported in the result)
                errors.append(repr(e))

    threads = [threading.Thread(target=fill, args=(w,)) for w in range(args.drivers)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    fill_s = time.perf_counter() - t0
    print(f"  filled {len(sessions)} sessions on {args.backends} backends in {fill_s:.1f} s")

    before = ray.get(planner.stats.remote())
    counters_before = ray.get([h.counters.remote() for h in hosts])
    stop = time.time() + args.seconds

    def churn(worker: int) -> None:
        rng = random.Random(1000 + worker)
        while time.time() < stop:
            with lock:
                sid = rng.choice(list(sessions)) if sessions else None
            try:
                if sid is not None:
                    close_one(sid)
                open_one("churn", rng)
            except Exception as e:  # noqa: BLE001
                errors.append(repr(e))

    threads = [threading.Thread(target=churn, args=(w,)) for w in range(args.drivers)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    churn_s = time.perf_counter() - t0
    after = ray.get(planner.stats.remote())
    counters = ray.get([h.counters.remote() for h in hosts])

    old_place = []
    for _ in range(args.old_place_repeats):
        t0 = time.perf_counter()
        stats = ray.get([host_of[n].stats.remote(n) for n in names])
        max(stats, key=lambda s: s["free_tokens"])
        old_place.append(time.perf_counter() - t0)

    def delta(kind: str, what: str = "calls") -> float:
        return float(after[what].get(kind, 0) - before[what].get(kind, 0))

    busy = sum(after["seconds"].values()) - sum(before["seconds"].values())
    held = {sid for c in counters for s in c["sessions"].values() for sid in s}
    misplaced = sum(model_of[backend] != model for model, backend in sessions.values())
    directory = ray.get(planner.directory.remote())
    plans = sum(c["plans"] for c in counters) - sum(c["plans"] for c in counters_before)
    plan_seconds = sum(c["plan_seconds"] for c in counters) - sum(c["plan_seconds"] for c in counters_before)
    load = ray.get(planner.load.remote())
    for h in hosts:
        ray.get(h.stop.remote())
        ray.kill(h)
    ray.kill(planner)
    return {
        "backends": args.backends, "hosts": args.hosts, "sessions": len(sessions), "drivers": args.drivers,
        "fill_s": fill_s, "churn_s": churn_s,
        "open_latency_s": {"fill_p50": _median(latencies["fill"]), "fill_p99": _p99(latencies["fill"]),
                           "churn_p50": _median(latencies["churn"]), "churn_p99": _p99(latencies["churn"])},
        "opens_in_churn": len(latencies["churn"]),
        "open_backend_s": _median(open_backend),
        "reports_per_s": delta("report_load") / churn_s,
        "reports_per_backend_s": delta("report_load") / churn_s / args.backends,
        "placements_per_s": delta("place") / churn_s,
        "planner_busy_fraction": busy / churn_s,
        "planner_cpu_fraction": (after["cpu_s"] - before["cpu_s"]) / churn_s,
        "session_events_per_backend_s": (delta("place") + delta("forget")) / churn_s / args.backends,
        "in_process_plans_per_s": plans / churn_s,
        "in_process_plans_per_backend_s": plans / churn_s / args.backends,
        "in_process_plan_ms": plan_seconds / plans * 1e3 if plans else 0.0,
        "old_placement_s": {"p50": _median(old_place), "p99": _p99(old_place)},
        "misplaced_sessions": misplaced,
        "sessions_missing_on_backends": len(set(sessions) - held),
        "directory_matches": directory == {sid: b for sid, (_, b) in sessions.items()},
        "view_totals": load["totals"],
        "live_sessions_per_backend": load["totals"]["live_sessions"] / args.backends,
        "errors": errors[:5], "error_count": len(errors),
    }


def report_rate(min_interval_s: float, heartbeat_s: float, change_fraction: float, budget_tokens: int,
                session_events_per_s: float, decode_tokens_per_s: float) -> float:
    """Reports one backend pushes per second, at most: a heartbeat, one per session opened or
    closed, one per ``change_fraction`` of its budget decoded; never more than the limiter lets."""
    drift = decode_tokens_per_s / max(1.0, change_fraction * budget_tokens)
    return min(1.0 / min_interval_s, 1.0 / heartbeat_s + session_events_per_s + drift)


def extrapolate(costs: dict[str, Any], sim: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    c = Costs(costs["rtt_s"], costs["report_s"], costs["place_base_s"], costs["place_per_backend_s"],
              costs["forget_s"], costs["plan_s"], sim["open_backend_s"],
              sim["old_placement_s"]["p50"] / sim["backends"], costs["report_bytes"])
    limiter = (args.min_interval_ms / 1e3, args.heartbeat_s, args.change_fraction)
    sim_rate = report_rate(*limiter, args.budget_tokens, sim["session_events_per_backend_s"],
                           sim["live_sessions_per_backend"] * args.tokens_per_step / (args.step_ms / 1e3))
    per_backend = args.sessions_per_backend_at_scale
    events = 2 * per_backend / args.session_lifetime_s  # each session opens and closes once
    r = report_rate(*limiter, args.budget_tokens_at_scale, events, args.decode_tokens_per_s_at_scale)
    f = args.plans_per_backend_s
    # the simulated workload itself (its churn is far above the 100,000-session one): the model's
    # prediction against what was measured; costs measured alone run slower among the simulation's
    # processes, so the extrapolation is also given with costs scaled to match the measurement
    at_sim = Workload(sim["backends"], int(sim["placements_per_s"] * args.session_lifetime_s),
                      args.session_lifetime_s, sim["reports_per_backend_s"], f)
    predicted = planner_load(c, at_sim)
    busy = sim["planner_cpu_fraction"] - costs["idle_cpu_fraction"]
    factor = max(1.0, busy / predicted["utilisation"]) if predicted["utilisation"] > 0 else 1.0
    cal = c.scaled(factor)
    rows = []
    for b in (10, 50, 100, 200, 500, 1_000, 2_000, 5_000):
        w = Workload(b, int(b * per_backend), args.session_lifetime_s, r, f)
        rows.append({"backends": b, "sessions": w.sessions, **planner_load(c, w),
                     "open_latency_s": open_latency_s(c, w),
                     "utilisation_calibrated": planner_load(cal, w)["utilisation"],
                     "open_latency_s_calibrated": open_latency_s(cal, w)["new"]})
    target = Workload(args.extrapolate_backends, args.extrapolate_sessions, args.session_lifetime_s, r, f)
    return {
        "costs": as_dict(c), "reports_per_backend_s": r, "plans_per_backend_s_old_path": f,
        "session_lifetime_s": args.session_lifetime_s, "calibration_factor": factor, "rows": rows,
        "target": {"backends": target.backends, "sessions": target.sessions, **planner_load(c, target),
                   "open_latency_s": open_latency_s(c, target),
                   "calibrated": {**planner_load(cal, target), "open_latency_s": open_latency_s(cal, target)}},
        "saturation_backends": saturation_backends(c, per_backend, args.session_lifetime_s, r, f),
        "saturation_backends_calibrated": saturation_backends(cal, per_backend, args.session_lifetime_s, r, f),
        "check_at_simulated_size": {
            "predicted_reports_per_backend_s": sim_rate,
            "measured_reports_per_backend_s": sim["reports_per_backend_s"],
            "predicted_planner_cpu_fraction": predicted["utilisation"] + costs["idle_cpu_fraction"],
            "measured_planner_cpu_fraction": sim["planner_cpu_fraction"],
            "predicted_open_latency_s": open_latency_s(c, at_sim)["new"],
            "measured_open_latency_p50_s": sim["open_latency_s"]["churn_p50"],
        },
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    parser.add_argument("--backends", type=int, default=200)
    parser.add_argument("--hosts", type=int, default=4, help="SimHost actors the backends are spread over")
    parser.add_argument("--sessions-per-backend", type=int, default=4)
    parser.add_argument("--drivers", type=int, default=4, help="driver threads opening sessions")
    parser.add_argument("--seconds", type=float, default=20.0, help="length of the churn phase")
    parser.add_argument("--budget-tokens", type=int, default=4096)
    parser.add_argument("--n-seq-max", type=int, default=16)
    parser.add_argument("--step-ms", type=float, default=100.0, help="simulated decode step")
    parser.add_argument("--tokens-per-step", type=int, default=4)
    parser.add_argument("--min-interval-ms", type=float, default=1000 * ReportLimiter.min_interval_s)
    parser.add_argument("--change-fraction", type=float, default=0.05)
    parser.add_argument("--heartbeat-s", type=float, default=2.0)
    parser.add_argument("--old-place-repeats", type=int, default=10)
    parser.add_argument("--view-sizes", default="10,100,1000,5000")
    parser.add_argument("--calls", type=int, default=500, help="calls per cost measurement")
    parser.add_argument("--idle-s", type=float, default=2.0, help="how long the idle planner's CPU is measured")
    parser.add_argument("--extrapolate-backends", type=int, default=1_000)
    parser.add_argument("--extrapolate-sessions", type=int, default=100_000)
    parser.add_argument("--sessions-per-backend-at-scale", type=float, default=100.0)
    parser.add_argument("--budget-tokens-at-scale", type=int, default=65_536, help="a GPU backend's KV budget")
    parser.add_argument("--decode-tokens-per-s-at-scale", type=float, default=16 * 20.0,
                        help="tokens a backend decodes per second (16 live sessions at 20 tokens/s)")
    parser.add_argument("--session-lifetime-s", type=float, default=600.0)
    parser.add_argument("--plans-per-backend-s", type=float, default=10.0,
                        help="old path: steps a backend needs planned per second (batched decoding)")
    args = parser.parse_args(argv)

    import ray

    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, namespace="kvres-cluster-sim")
    try:
        print("costs:")
        costs = measure_costs([int(x) for x in args.view_sizes.split(",")], args.calls, args.idle_s)
        print(f"  report {costs['report_s'] * 1e6:.0f} us, forget {costs['forget_s'] * 1e6:.0f} us, "
              f"old-path plan {costs['plan_s'] * 1e3:.2f} ms, round trip {costs['rtt_s'] * 1e3:.2f} ms")
        print(f"simulation: {args.backends} backends")
        sim = simulate(args)
    finally:
        if started:
            ray.shutdown()
    model = extrapolate(costs, sim, args)
    result = {"costs": costs, "simulation": sim, "model": model}
    t = model["target"]
    print(f"  open latency p50 {sim['open_latency_s']['churn_p50'] * 1e3:.1f} ms (old placement alone "
          f"{sim['old_placement_s']['p50'] * 1e3:.1f} ms), {sim['reports_per_s']:.0f} reports/s, planner busy "
          f"{sim['planner_busy_fraction']:.1%}, misplaced {sim['misplaced_sessions']}")
    print(f"model at {t['backends']} backends / {t['sessions']} sessions: planner utilisation "
          f"{t['utilisation']:.1%} (old path {t['utilisation_old']:.0%}), open latency "
          f"{t['open_latency_s']['new'] * 1e3:.1f} ms (old {t['open_latency_s']['old'] * 1e3:.0f} ms), "
          f"{t['report_bytes_per_s'] / 1e3:.0f} kB/s of reports; saturates at "
          f"{model['saturation_backends']['new']:.0f} backends (old {model['saturation_backends']['old']:.0f}); "
          f"calibrated x{model['calibration_factor']:.2f}: utilisation {t['calibrated']['utilisation']:.1%}, "
          f"saturates at {model['saturation_backends_calibrated']['new']:.0f} backends")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "cluster_sim.json").write_text(json.dumps(result, indent=2, default=float))
    plot(result, args.out / "cluster_sim.png")
    return result


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    model, sim = result["model"], result["simulation"]
    rows = model["rows"]
    b = [r["backends"] for r in rows]
    fig, (util, lat, traffic) = plt.subplots(1, 3, figsize=(15, 4.2))
    util.loglog(b, [r["utilisation"] for r in rows], "o-", label="new: pushed load + placement")
    util.loglog(b, [r["utilisation_calibrated"] for r in rows], "o:", color="C0", mfc="none",
                label=f"new, costs x{model['calibration_factor']:.2f} (calibrated)")
    util.loglog(b, [r["utilisation_old"] for r in rows], "x--", label="old: every step's plan via the planner")
    util.axhline(1.0, color="red", lw=0.8)
    util.axvline(model["saturation_backends"]["new"], color="C0", lw=0.6, ls=":")
    util.axvline(model["saturation_backends"]["old"], color="C1", lw=0.6, ls=":")
    check = model["check_at_simulated_size"]
    util.plot([sim["backends"]], [check["measured_planner_cpu_fraction"]], "k*", ms=10,
              label="simulated workload: measured")
    util.plot([sim["backends"]], [check["predicted_planner_cpu_fraction"]], "kD", ms=6, mfc="none",
              label="simulated workload: model")
    util.set_xlabel("backends (sessions = backends x 100)")
    util.set_ylabel("planner utilisation (CPU seconds per second)")
    util.set_title("one planner actor")
    util.legend(fontsize=8)
    lat.loglog(b, [r["open_latency_s"]["new"] * 1e3 for r in rows], "o-", label="new: one planner call")
    lat.loglog(b, [r["open_latency_s_calibrated"] * 1e3 for r in rows], "o:", color="C0", mfc="none",
               label="new, calibrated")
    lat.loglog(b, [r["open_latency_s"]["old"] * 1e3 for r in rows], "x--", label="old: stats of every backend")
    lat.plot([sim["backends"]], [check["measured_open_latency_p50_s"] * 1e3], "k*", ms=10,
             label="simulated workload: measured p50")
    lat.plot([sim["backends"]], [check["predicted_open_latency_s"] * 1e3], "kD", ms=6, mfc="none",
             label="simulated workload: model")
    lat.plot([sim["backends"]], [sim["old_placement_s"]["p50"] * 1e3], "C1*", ms=10,
             label="old placement alone: measured")
    lat.set_xlabel("backends")
    lat.set_ylabel("open_session latency (ms)")
    lat.set_title("opening a session")
    lat.legend(fontsize=8)
    traffic.loglog(b, [r["report_bytes_per_s"] / 1e3 for r in rows], "o-", label="pushed load (kB/s)")
    traffic.loglog(b, [r["reports_per_s"] for r in rows], "s--", label="reports/s")
    traffic.plot([sim["backends"]], [sim["reports_per_s"]], "k*", ms=10, label="simulated workload: reports/s")
    traffic.set_xlabel("backends")
    traffic.set_title("load reports reaching the planner")
    traffic.legend(fontsize=8)
    for ax in (util, lat, traffic):
        ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


if __name__ == "__main__":
    main()
