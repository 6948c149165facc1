"""A soak with faults: ``kvres serve`` on a standing cluster under HTTP chat traffic while its
processes are killed, audited at the end.

Run: ``.venv/bin/python -m benchmarks.soak [--duration-s 1200] [--faults-each 2]
[--front local|direct|serve] [--faults backend,coldstore,planner,state[,replica,proxy]] [--clients 16]
[--responses-clients 8]
[--conversations-per-client 2] [--turns 8] [--user-words 12] [--reply-tokens 24] [--slots 8]
[--kv-budget 2048] [--session-budget 192] [--replicas 2] [--window-s 60] [--warmup-s 300]
[--model PATH] [--out DIR]``. Writes ``soak.json``, ``soak.png`` and ``soak-attempts.jsonl`` (every
request as its client saw it) into DIR (default benchmarks/results); exits 1 where an invariant did
not hold (``--no-fail`` keeps 0).

- The cluster (``cluster.py``): ``kvres start`` (a Ray head on free ports, the dashboard on, one
  llama backend of ``--slots`` sequence slots and a ``--kv-budget``-token KV budget, sessions of a
  streaming policy that keeps ``--session-budget`` tokens resident and spills the rest to the cold
  store, whose small RAM tier sends blocks on to disk), then ``kvres serve --address ... --detach``
  ``--front`` (default: kvres serve's, ``KVRES_SERVE_FRONT`` else the front inside the backend's
  process; ``direct``: ``--replicas`` front actors; ``serve``: ``--replicas`` Serve replicas). The model:
  ``--model``, else the project's default chat model.
- The traffic (``traffic.py``): ``--clients`` threads; ``--responses-clients`` of them hold
  Responses chains (``previous_response_id``), the others chat conversations bound by
  ``X-Session-Id``; each keeps ``--conversations-per-client`` conversations going (more sessions
  than slots), each turn a user message of ``--user-words`` random words and a greedy reply of at
  most ``--reply-tokens`` tokens, streamed; a conversation ends after ``--turns`` turns, is
  audited (``audit.py``) and deleted, and a fresh one starts.
- The faults (``faults.py``): ``--faults-each`` rounds of the ``--faults`` kinds (a backend actor,
  the cold store, the planner, the serve state actor, and where the front has processes of its own
  a Serve replica or the first direct front and the HTTP proxy or the last one), SIGKILL of
  the actor's process found with Ray's state API, planned evenly from ``--faults-from-s`` to
  ``--faults-to-s`` but each only once the previous one recovered (and ``--settle-s`` after).
- Resident memory (``memory.py``): every process of the head every ``--rss-every-s`` seconds.

The run lasts ``--duration-s``, longer where the faults slid later: it ends once every fault was
made and ``--window-s`` passed after the last one recovered (at most ``--duration-s`` + 900 s);
then each client finishes its turn (retries included, ``--drain-s`` at most) and every open
conversation is audited. What it reports is ``report.py``'s (docs/operators.md, "A soak with
faults").
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from kvres.cluster.serve.launch import FRONTS, default_front

from .audit import ChatRender
from .cluster import FAULTS, SoakCluster, faults_of, soak_config
from .faults import Injector, schedule
from .memory import RssSampler, rss_trend
from .report import plot, summarize
from .traffic import Traffic, TrafficShape

ROOT = Path(__file__).resolve().parents[2]
OVERRUN_S = 900.0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks.soak", description=(__doc__ or "").splitlines()[0])
    p.add_argument("--duration-s", type=float, default=1200.0, help="how long the traffic runs at least (default 20 min)")
    p.add_argument("--faults-each", type=int, default=2, help="faults of each kind (default 2)")
    p.add_argument("--front", choices=FRONTS, default=None, help="kvres serve's front (default: its own default)")
    p.add_argument("--faults", default=None, help=f"the kinds, comma-separated, of {','.join(FAULTS)} (default: every "
                                                  f"kind the front has; local: {','.join(faults_of('local'))})")
    p.add_argument("--faults-from-s", type=float, default=None, help="the first fault's time (default 10%% of the run)")
    p.add_argument("--faults-to-s", type=float, default=None, help="the last fault's time (default 80%% of the run)")
    p.add_argument("--settle-s", type=float, default=5.0, help="a fault waits this long after the previous recovered")
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--responses-clients", type=int, default=None, help="clients on Responses chains (default half)")
    p.add_argument("--conversations-per-client", type=int, default=2)
    p.add_argument("--turns", type=int, default=8, help="turns of a conversation before it is audited and closed")
    p.add_argument("--user-words", type=int, default=12)
    p.add_argument("--reply-tokens", type=int, default=24, help="max_tokens of a reply (the model may stop sooner)")
    p.add_argument("--slots", type=int, default=8, help="the backend's sequence slots (n_seq_max)")
    p.add_argument("--kv-budget", type=int, default=2048, help="the backend's KV budget in tokens")
    p.add_argument("--session-budget", type=int, default=192, help="the tokens a session keeps resident; the rest spills")
    p.add_argument("--replicas", type=int, default=2, help="HTTP fronts (or Serve replicas)")
    p.add_argument("--threads", type=int, default=1, help="the backend's llama.cpp threads")
    p.add_argument("--window-s", type=float, default=60.0, help="the latency windows before and after each fault")
    p.add_argument("--warmup-s", type=float, default=300.0, help="resident memory's trend is taken after this")
    p.add_argument("--rss-every-s", type=float, default=5.0)
    p.add_argument("--drain-s", type=float, default=300.0)
    p.add_argument("--model", type=Path, default=None, help="a GGUF with a chat template (default: the project's)")
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    p.add_argument("--no-fail", action="store_true", help="exit 0 even where an invariant did not hold")
    return p


def settings_of(args: argparse.Namespace) -> dict[str, Any]:
    front = args.front or default_front()
    kinds = faults_of(front) if args.faults is None else tuple(k for k in args.faults.split(",") if k)
    unknown = sorted(set(kinds) - set(faults_of(front)))
    if unknown:
        raise SystemExit(f"--faults: kinds {unknown} are not the {front} front's; its kinds are "
                         f"{', '.join(faults_of(front))}")
    if args.duration_s <= 0 or args.window_s <= 0 or args.faults_each < 0:
        raise SystemExit("--duration-s and --window-s must be > 0, --faults-each >= 0")
    responses = args.clients // 2 if args.responses_clients is None else args.responses_clients
    shape = TrafficShape(args.clients, args.conversations_per_client, responses, args.turns, args.user_words,
                         args.reply_tokens)  # a ValueError names a bad size
    start = args.duration_s * 0.1 if args.faults_from_s is None else args.faults_from_s
    end = args.duration_s * 0.8 if args.faults_to_s is None else args.faults_to_s
    if not 0 <= start <= end:
        raise SystemExit(f"the faults' span must satisfy 0 <= from <= to, got {start} and {end}")
    return {"front": front, "duration_s": args.duration_s, "faults": kinds, "faults_each": args.faults_each, "faults_from_s": start,
            "faults_to_s": end, "settle_s": args.settle_s, "clients": shape.clients,
            "responses_clients": shape.responses_clients, "conversations_per_client": shape.conversations_per_client,
            "sessions": shape.sessions, "turns_per_conversation": shape.turns, "user_words": shape.user_words,
            "reply_tokens": shape.reply_tokens, "slots": args.slots, "kv_budget_tokens": args.kv_budget,
            "session_budget_tokens": args.session_budget, "replicas": args.replicas, "threads": args.threads,
            "window_s": args.window_s, "warmup_s": args.warmup_s, "rss_every_s": args.rss_every_s,
            "shape": shape}


def _progress(traffic: Traffic, started: float) -> str:
    attempts = list(traffic.attempts)
    count = {k: sum(1 for a in attempts if a.outcome == k) for k in ("ok", "failed", "refused", "unreachable")}
    return (f"soak: {time.monotonic() - started:.0f} s: {count['ok']} turns, {count['failed']} failed tries, "
            f"{count['refused']} refused, {count['unreachable']} unreachable; {len(traffic.audits)} audited")


def run(settings: dict[str, Any], model: Path, out: Path, drain_s: float) -> dict[str, Any]:
    shape: TrafficShape = settings.pop("shape")
    render = ChatRender(model)
    folder = Path(tempfile.mkdtemp(prefix="kvres-soak-"))
    config = soak_config(model, folder / "cold", slots=settings["slots"], kv_budget_tokens=settings["kv_budget_tokens"],
                         session_budget_tokens=settings["session_budget_tokens"], threads=settings["threads"])
    cluster = SoakCluster(config, folder, replicas=settings["replicas"], front=settings["front"])
    try:
        t0 = time.monotonic()
        cluster.start()
        print(f"soak: kvres serve at {cluster.base_url} (cluster {cluster.address}, namespace {cluster.namespace}) "
              f"after {time.monotonic() - t0:.0f} s", flush=True)
        traffic = Traffic(cluster.base_url, cluster.model_id, shape, render)
        faults = schedule(settings["faults"], settings["faults_each"], settings["faults_from_s"], settings["faults_to_s"])
        sampler = RssSampler(cluster.processes, traffic.clock, settings["rss_every_s"])
        injector = Injector(faults, cluster.kill, traffic.clock, traffic.first_ok_after, settings["settle_s"])
        started = time.monotonic()
        traffic.start()
        sampler.start()
        injector.start()
        last_print = 0.0
        while True:
            now = traffic.clock()
            last = next((f for f in reversed(faults) if f.at_s is not None), None)
            recovered = None if last is None or last.at_s is None else traffic.first_ok_after(last.at_s)
            settled = not faults or (injector.done() and (last is None or (
                recovered is not None and now >= recovered + settings["window_s"])))
            if (now >= settings["duration_s"] and settled) or now >= settings["duration_s"] + OVERRUN_S:
                break
            if now - last_print >= 30.0:
                print(_progress(traffic, started), flush=True)
                last_print = now
            time.sleep(1.0)
        injector.stop()
        wall = traffic.clock()
        print(f"soak: traffic stops after {wall:.0f} s; draining and auditing", flush=True)
        traffic.stop(drain_s)
        sampler.stop()
    finally:
        cluster.stop()
        shutil.rmtree(folder, ignore_errors=True)
    settings = {**settings, "model": str(model), "cluster": {"address": cluster.address, "namespace": cluster.namespace}}
    result = summarize(traffic.attempts, traffic.audits, faults, rss_trend(sampler.samples, settings["warmup_s"]),
                       settings, wall)
    result["unfinished_conversations"] = list(traffic.unfinished)
    out.mkdir(parents=True, exist_ok=True)
    (out / "soak.json").write_text(json.dumps(result, indent=2, default=str))
    with (out / "soak-attempts.jsonl").open("w") as f:  # every request, for a look at what the summary counts
        for attempt in traffic.attempts:
            f.write(json.dumps(asdict(attempt)) + "\n")
    plot(result, sampler.samples, traffic.attempts, out / "soak.png")
    _print(result)
    return result


def _print(result: dict[str, Any]) -> None:
    audit = result["audit"]
    print(f"soak: {result['turns_completed']} turns completed in {result['wall_s']:.0f} s; failed tries "
          f"{result['failed_tries']} ({result['failed_in_flight_at_a_kill']} in flight at a kill, "
          f"{result['failed_not_at_a_kill']} not); retries failed {result['retries_failed']}; refusals "
          f"{result['refusals'] or 0}; unreachable {result['unreachable']}")
    print(f"audit: {audit['audited']} conversations, {audit['sessions_lost']} sessions lost, {audit['mismatched']} "
          f"logs not as sent and received, tokens lost {audit['tokens_lost']}, duplicated {audit['tokens_duplicated']}")
    print("| fault | at (s) | recover (s) | all clients (s) | p50 / p99 before (s) | during | after |")
    print("|---|---|---|---|---|---|---|")
    for r in result["faults"]:
        cells = [f"{r[w]['latency_p50_s']} / {r[w]['latency_p99_s']}" for w in ("before", "during", "after")]
        print(f"| {r['kind']} | {r['at_s']:.0f} | {r['recover_s']} | {r['all_clients_s']} | " + " | ".join(cells) + " |")
    total = result["rss"].get("total")
    if total:
        print(f"resident memory after {result['rss']['warmup_s']:.0f} s: {total['first_mib']} -> {total['last_mib']} MiB, "
              f"{total['slope_mib_per_min']} MiB/min")
    for name, ok in result["bars"].items():
        print(f"  {'ok ' if ok else 'NOT'} {name}")


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = build_parser().parse_args(argv)
    try:
        settings = settings_of(args)
    except ValueError as exc:
        raise SystemExit(str(exc)) from None
    from kvres.actors.default_model import default_model_path

    model = args.model or default_model_path()
    result = run(settings, Path(model), args.out, args.drain_s)
    if not all(result["invariants"].values()) and not args.no_fail and argv is None:
        sys.exit(1)
    return result


if __name__ == "__main__":
    main()
