"""Resident memory of every process of ``kvres serve`` under steady bound chat traffic: what each turn
leaves behind, Ray's GCS first.

Run: ``.venv/bin/python -m benchmarks.gcs_growth [--minutes 3] [--warmup-s 60] [--sample-s 5]
[--clients 4] [--turns 8] [--reply-tokens 16] [--ray-defaults] [--config JSON] [--out DIR]``. Writes
``gcs_growth.json`` and ``gcs_growth.png`` into DIR (default benchmarks/results;
``gcs_growth_ray_defaults.*`` with ``--ray-defaults``).

- The server: ``kvres serve`` on its defaults (an embedded Ray cluster, the project's chat model,
  one replica at first), started as a subprocess on a free port of 127.0.0.1 and stopped at the
  end; ``--config`` gives it a ``KvresConfig``. ``--ray-defaults``: ``KVRES_RAY_TASK_EVENTS=1`` in its
  environment, so Ray's own task-event defaults hold (kvres's actors report task events, the GCS
  keeps 100,000 of them), the way kvres ran before it set them.
- The traffic: ``--clients`` threads, each one bound conversation (``X-Session-Id``) after another:
  ``--turns`` turns of a short user message and a streamed reply of ``--reply-tokens`` tokens (the
  turns of ``benchmarks.serve``), then the session deleted and the next one opened; for
  ``--minutes`` after the first turn.
- The samples: every ``--sample-s`` seconds the resident memory (VmRSS) of every process of the
  server (the ``kvres serve`` driver, the GCS, the raylet, Ray's agents and dashboard, every worker:
  kvres's actors, Serve's controller, proxy and replicas), and the task events the GCS says it holds.
- Reported: per process and for the whole group, the slope after ``--warmup-s`` (least squares,
  MiB per minute) and the growth over that time; the turns served; the GCS's growth per turn and
  its task events per turn; where task events keep arriving, the bytes each one holds in the GCS
  (its growth per turn over the events per turn) and where the GCS would level off at the cap it
  runs with (``task_events_max_num_task_in_gcs``).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.gcs_growth.sampling import gcs_session_dir, gcs_task_events, process_rss, slope_per_minute

ROOT = Path(__file__).resolve().parents[2]
RAY_DEFAULT_CAP = 100_000  # Ray's task_events_max_num_task_in_gcs
MIB = float(1 << 20)
MIN_EVENTS_FOR_ESTIMATE = 100  # stored task events the run must add before their bytes are estimated


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_server(port: int, ray_defaults: bool, config: str | None, log: list[str],
                 timeout_s: float = 600.0) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "KVRES_RAY_TASK_EVENTS")}
    env.update({"PYTHONUNBUFFERED": "1", **({"KVRES_RAY_TASK_EVENTS": "1"} if ray_defaults else {})})
    command = [sys.executable, "-m", "kvres.cluster.cli", "serve", "--port", str(port),
               "--namespace", f"kvres-gcs-growth-{uuid.uuid4().hex[:6]}", *(["--config", config] if config else [])]
    process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True, start_new_session=True)
    ready = threading.Event()

    def read() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            log.append(line)
            if line.startswith("kvres serve: listening on"):
                ready.set()
        ready.set()

    threading.Thread(target=read, daemon=True).start()
    if not ready.wait(timeout_s) or process.poll() is not None:
        stop_server(process)
        raise RuntimeError("kvres serve did not start:\n" + "".join(log[-60:]))
    return process


def stop_server(process: subprocess.Popen[str]) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=120)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)  # the group this benchmark started, nothing else
            process.wait(timeout=30)


def _model_id(base: str) -> str:
    import httpx

    deadline = time.monotonic() + 300
    while True:
        try:
            answer = httpx.get(f"{base}/v1/models", timeout=30)
            if answer.status_code == 200:
                return str(answer.json()["data"][0]["id"])
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"{base}/v1/models did not answer")
        time.sleep(1.0)


def drive(base: str, model: str, clients: int, turns: int, reply_tokens: int, stop: threading.Event,
          served: list[float], errors: list[str]) -> list[threading.Thread]:
    """``clients`` threads of bound conversations until ``stop``; each turn's end time is appended to
    ``served``."""
    import httpx

    from benchmarks.serve.__main__ import _turn, _words

    def client(c: int) -> None:
        rng = np.random.default_rng(c)
        try:
            with httpx.Client(base_url=base, timeout=600) as http:
                while not stop.is_set():
                    session = f"growth-{c}-{uuid.uuid4().hex[:10]}"
                    messages: list[dict[str, str]] = []
                    for _ in range(turns):
                        if stop.is_set():
                            break
                        messages.append({"role": "user", "content": _words(rng, 8)})
                        row = _turn(http, model, messages, session, reply_tokens)
                        messages.append({"role": "assistant", "content": row["text"]})
                        served.append(time.monotonic())
                    http.delete(f"/v1/sessions/{session}")
        except Exception as exc:  # reported, and the run fails
            errors.append(f"client {c}: {type(exc).__name__}: {exc}")
            stop.set()

    threads = [threading.Thread(target=client, args=(c,), daemon=True) for c in range(clients)]
    for t in threads:
        t.start()
    return threads


def sample(root: int, session_dir: Path | None, t0: float, served: list[float]) -> dict[str, Any]:
    return {"t_s": time.monotonic() - t0, "turns": len(served),
            "rss": {str(pid): [name, rss] for pid, (name, rss) in process_rss(root).items()},
            "gcs_task_events": gcs_task_events(session_dir)}


def analyse(samples: list[dict[str, Any]], warmup_s: float, cap: int) -> dict[str, Any]:
    """Per process (keyed by pid, named by its last name) and for the group: MiB/min after warm-up."""
    late = [s for s in samples if s["t_s"] >= warmup_s]
    if len(late) < 3:
        raise RuntimeError(f"{len(late)} samples after a warm-up of {warmup_s:.0f} s: run longer")
    processes: dict[str, dict[str, Any]] = {}
    pids = {pid for s in late for pid in s["rss"]}
    for pid in pids:
        seen = [(s["t_s"], s["rss"][pid][1]) for s in late if pid in s["rss"]]
        if len(seen) < 3:
            continue
        name = next(s["rss"][pid][0] for s in reversed(late) if pid in s["rss"])
        times, rss = [t for t, _ in seen], [r / MIB for _, r in seen]
        processes[pid] = {"name": name, "rss_mib_start": rss[0], "rss_mib_end": rss[-1],
                          "growth_mib": rss[-1] - rss[0], "slope_mib_per_min": slope_per_minute(times, rss)}
    times = [s["t_s"] for s in late]
    totals = [sum(r for _, r in s["rss"].values()) / MIB for s in late]
    minutes = (times[-1] - times[0]) / 60.0
    turns = late[-1]["turns"] - late[0]["turns"]
    gcs = [p for p in processes.values() if p["name"] == "gcs_server"]
    gcs_slope = gcs[0]["slope_mib_per_min"] if gcs else float("nan")
    turns_per_min = turns / minutes if minutes > 0 else float("nan")
    events = [(s["t_s"], s["turns"], s["gcs_task_events"]) for s in samples if s["gcs_task_events"]]
    stored_growth = events[-1][2].get("stored", 0) - events[0][2].get("stored", 0) if len(events) > 1 else 0
    event_turns = events[-1][1] - events[0][1] if len(events) > 1 else 0
    reported = events[-1][2].get("reported", 0) if events else 0
    result: dict[str, Any] = {
        "warmup_s": warmup_s, "measured_min": minutes, "turns": turns, "turns_per_min": turns_per_min,
        "group_slope_mib_per_min": slope_per_minute(times, totals), "group_growth_mib": totals[-1] - totals[0],
        "gcs_slope_mib_per_min": gcs_slope,
        "gcs_bytes_per_turn": gcs_slope * MIB / turns_per_min if turns_per_min > 0 else float("nan"),
        "gcs_task_events_last": events[-1][2] if events else {},
        "gcs_task_events_reported": reported,
        "task_events_per_turn": stored_growth / event_turns if event_turns else 0.0,
        "task_event_cap": cap,
        "processes": dict(sorted(processes.items(), key=lambda kv: -kv[1]["slope_mib_per_min"])),
    }
    per_turn = result["task_events_per_turn"]
    if stored_growth >= MIN_EVENTS_FOR_ESTIMATE and result["gcs_bytes_per_turn"] > 0:
        per_event = result["gcs_bytes_per_turn"] / per_turn
        result["gcs_bytes_per_task_event"] = per_event
        result["gcs_level_off_mib_above_start"] = cap * per_event / MIB  # once `cap` events are stored
        result["turns_to_level_off"] = cap / per_turn
    return result


def run(args: argparse.Namespace) -> dict[str, Any]:
    log: list[str] = []
    port = _free_port()
    process = start_server(port, args.ray_defaults, args.config, log)
    base = f"http://127.0.0.1:{port}"
    stop = threading.Event()
    served: list[float] = []
    errors: list[str] = []
    samples: list[dict[str, Any]] = []
    try:
        model = _model_id(base)
        session_dir = gcs_session_dir(process.pid)
        threads = drive(base, model, args.clients, args.turns, args.reply_tokens, stop, served, errors)
        while not served and not stop.is_set():  # the clock starts with the first turn served
            time.sleep(0.2)
        t0 = time.monotonic()
        end = t0 + 60.0 * args.minutes
        while time.monotonic() < end and not stop.is_set():
            samples.append(sample(process.pid, session_dir, t0, served))
            line = samples[-1]
            total = sum(r for _, r in line["rss"].values()) / MIB
            print(f"{line['t_s']:6.0f} s: {line['turns']} turns, {len(line['rss'])} processes, {total:.0f} MiB; "
                  f"GCS task events {line['gcs_task_events'].get('stored', '?')}", flush=True)
            stop.wait(args.sample_s)
        stop.set()
        for t in threads:
            t.join(timeout=600)
        if errors:
            raise RuntimeError("; ".join(errors))
    finally:
        stop.set()
        stop_server(process)
    cap = RAY_DEFAULT_CAP if args.ray_defaults else _kvres_cap()
    result = analyse(samples, args.warmup_s, cap)
    result.update({"ray_defaults": args.ray_defaults, "clients": args.clients, "turns_per_session": args.turns,
                   "reply_tokens": args.reply_tokens, "sample_s": args.sample_s, "model": model,
                   "config": args.config, "samples": samples})
    return result


def _kvres_cap() -> int:
    from kvres.cluster.ray_task_events import TASK_EVENT_STORE

    return int(TASK_EVENT_STORE["task_events_max_num_task_in_gcs"])


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=3.0, help="traffic after the first turn (default 3)")
    parser.add_argument("--warmup-s", type=float, default=60.0, help="samples before this are left out of slopes")
    parser.add_argument("--sample-s", type=float, default=5.0, help="seconds between samples (default 5)")
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--turns", type=int, default=8, help="turns of each conversation before the next")
    parser.add_argument("--reply-tokens", type=int, default=16)
    parser.add_argument("--ray-defaults", action="store_true",
                        help="KVRES_RAY_TASK_EVENTS=1: Ray's own task-event defaults, as before kvres set them")
    parser.add_argument("--config", default=None, help="a KvresConfig (JSON) for kvres serve (default: its own)")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = parser.parse_args(argv)
    if min(args.clients, args.turns, args.reply_tokens) < 1 or args.minutes <= 0 or args.sample_s <= 0:
        parser.error("--clients, --turns, --reply-tokens must be >= 1; --minutes and --sample-s > 0")
    if args.warmup_s >= 60.0 * args.minutes:
        parser.error(f"--warmup-s {args.warmup_s:.0f} leaves nothing of --minutes {args.minutes}")

    result = run(args)
    name = "gcs_growth_ray_defaults" if args.ray_defaults else "gcs_growth"
    print(f"{'Ray defaults' if args.ray_defaults else 'kvres settings'}: {result['turns']} turns in "
          f"{result['measured_min']:.1f} min after warm-up ({result['turns_per_min']:.0f}/min); whole group "
          f"{result['group_slope_mib_per_min']:+.2f} MiB/min, gcs_server {result['gcs_slope_mib_per_min']:+.2f} "
          f"MiB/min ({result['gcs_bytes_per_turn']:.0f} B/turn), {result['task_events_per_turn']:.2f} task events "
          "per turn")
    for pid, p in result["processes"].items():
        print(f"  {p['name'][:48]:<48} pid {pid:>7}: {p['rss_mib_end']:7.1f} MiB, {p['slope_mib_per_min']:+.3f} "
              f"MiB/min")
    if "gcs_bytes_per_task_event" in result:
        print(f"GCS: {result['gcs_bytes_per_task_event']:.0f} B per task event: levels off about "
              f"{result['gcs_level_off_mib_above_start']:.0f} MiB above its start after "
              f"{result['turns_to_level_off']:.0f} turns (cap {result['task_event_cap']:,} task events)")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{name}.json").write_text(json.dumps(result, indent=2))
    _plot(result, args.out / f"{name}.png")
    return result


def _plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    samples = result["samples"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    minutes = [s["t_s"] / 60 for s in samples]
    left.plot(minutes, [sum(r for _, r in s["rss"].values()) / MIB for s in samples], label="all processes")
    left.axvline(result["warmup_s"] / 60, color="grey", linestyle=":", label="end of warm-up")
    left.set_xlabel("minutes of traffic")
    left.set_ylabel("resident memory (MiB)")
    left.set_title(f"kvres serve ({'Ray defaults' if result['ray_defaults'] else 'kvres settings'}): "
                   f"{result['group_slope_mib_per_min']:+.2f} MiB/min")
    left.legend()
    top = list(result["processes"].items())[:6]
    for pid, p in top:
        right.plot(minutes, [(s["rss"][pid][1] / MIB if pid in s["rss"] else np.nan) for s in samples],
                   label=f"{p['name'][:28]} {p['slope_mib_per_min']:+.2f}/min")
    right.set_xlabel("minutes of traffic")
    right.set_ylabel("resident memory (MiB)")
    right.set_title("the processes that grew most (slope after warm-up)")
    right.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


if __name__ == "__main__":
    main()
