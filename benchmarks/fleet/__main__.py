"""The fleet workload: many chat sessions over few slots, kvres beside what the engine offers alone.

Run: ``.venv/bin/python -m benchmarks.fleet [--large | --tiny] [--engine llama|openvino] [--kv-layout split|unified] [--model PATH]
[--sessions 16] [--history 512] [--turns 3] [--user-tokens 32] [--reply-tokens 16] [--users 8]
[--slots 4,16] [--shared-prefix 256] [--threads 2] [--reprefill-sessions 4] [--repeats 1]
[--two-calls] [--high 4] [--http] [--out DIR]``
Writes ``fleet.json`` and ``fleet.png`` (``fleet-openvino.*`` with ``--engine openvino``) into DIR
(default benchmarks/results).

Without ``--model`` it writes its own random-weight llama of realistic shape
(``benchmarks.realistic_model``: 12 layers, hidden 768, grouped-query attention, 32,000 tokens;
``--tiny``: a small one, for the test). S sessions with H-token histories share one kvres backend
(``kvres.cluster`` sessions on a local Ray cluster) that has fewer sequence slots than sessions
(and, for the second ``--slots`` value, as many); ``--users`` driver threads each take their
sessions' turns one after another: each turn one call that appends a ``--user-tokens`` message and
streams a ``--reply-tokens`` reply (``--two-calls``: ``append``, then ``stream``). Then the same
with every session starting from one shared ``--shared-prefix``-token system prompt (prefix
sharing on), and what opening a session that starts with it costs beside prefilling as many
unshared tokens; and a mixed run over the fewest slots, the first ``--high`` sessions at priority 1
and the rest at 0 (``SessionPolicy.with_retention``), reported as two rows (high and low turns).
``--engine openvino``: the backends run the OpenVINO engine in state mode on the same GGUF (its
graph built from the GGUF's weights; prefix sharing is llama.cpp's, so there it prefills).
Baselines, measured in the same run on the same model, engine and threads: one turn at a time with
states in host RAM (llama: llama-cpp-python's ``save_state`` / ``load_state``,
``benchmarks.fleet.baselines``; openvino: one infer request whose KV states are read out after a
turn and written back before the next, ``benchmarks.fleet.openvino_baselines``), re-prefilling the
whole history each turn, and (llama only) llama.cpp batching the same turns itself (every session
resident in one context), and the same with at most as many turns under way at once as the fewest
``--slots`` (``llama_batch_4_at_once`` by default: the engine's own bound for a server with that
many sequence slots, with no KV moved; ``ratios.engine_bounds`` sets both beside the slot and
re-prefill baselines); OpenVINO's stateful IR takes one sequence per request, so it has no such
row and the ratios to it are null.
With ``--repeats R`` the baselines and kvres run R times, alternating, and each
ratio is the median of the runs' paired ratios (this host's load drifts between runs).
Reported: turns/s, time to first token and turn latency p50 / p99, suspends / resumes / evictions
/ recomputed tokens per turn, peak resident tokens, bytes of parked KV per cold-store tier, the
first turns of one session on the fewest slots right after the cluster starts (a fresh probe cache,
``KVRES_CACHE_DIR``, so the backend's recall-cost probes run meanwhile: ``first_turns``), and the
ratios the acceptance of issue #32 names.

``--http``: instead, the same sizes as a chat fleet over HTTP (``benchmarks.chat_fleet``):
``kvres serve`` with the fewest ``--slots`` against llama-server (``make peers`` builds it once),
the sessions as conversations, the users as clients, ``--repeats`` runs of each side alternating;
writes ``fleet-http-<preset>.json`` / ``.png``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import uuid
from collections.abc import Callable
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from .baselines import batch_baseline, reprefill_baseline, slot_baseline
from .kvres_run import backend_config, first_turns, kvres_fleet, open_cost
from .openvino_baselines import ov_reprefill_baseline, ov_slot_baseline
from .workload import TurnTiming, Workload, summarize

Outcome = tuple[list[TurnTiming], float, dict[str, Any]]
# engine -> (slot baseline, re-prefill baseline, the engine batching the turns itself or None)
BASELINES: dict[str, tuple[Callable[[str, Workload, int], Outcome], Callable[[str, Workload, int, int], Outcome],
                           Callable[..., Outcome] | None]] = {
    "llama": (slot_baseline, reprefill_baseline, batch_baseline),
    "openvino": (ov_slot_baseline, ov_reprefill_baseline, None),
}
# what another engine's JSON adds (llama's stays as it was: its baselines are the module docstring's)
ENGINE_NOTES: dict[str, dict[str, Any]] = {"openvino": {
    "baselines": {"slot_baseline": "one OpenVINO infer request, one turn at a time, each session's KV states read "
                                   "out after its turn and written back before its next (host RAM)",
                  "reprefill_baseline": "one OpenVINO infer request re-prefilling the whole log each turn"},
    "not_measured": {"llama_batch": "no engine batching baseline: OpenVINO's stateful IR takes one sequence per "
                                    "infer request, so sessions cannot share a batch; the ratios to it and "
                                    "all_slots_ge_0.8x_llama_batch are null"},
}}

ROOT = Path(__file__).resolve().parents[2]
PRESETS: dict[str, dict[str, Any]] = {
    "default": {"sessions": 16, "history": 512, "turns": 3, "user_tokens": 32, "reply_tokens": 16, "users": 8,
                "slots": "4,16", "shared_prefix": 256, "reprefill_sessions": 4, "threads": 2},
    "large": {"sessions": 64, "history": 2048, "turns": 4, "user_tokens": 64, "reply_tokens": 32, "users": 32,
              "slots": "16,64", "shared_prefix": 512, "reprefill_sessions": 8, "threads": os.cpu_count() or 2},
    "tiny": {"sessions": 4, "history": 48, "turns": 2, "user_tokens": 8, "reply_tokens": 4, "users": 3,
             "slots": "2,4", "shared_prefix": 16, "reprefill_sessions": 2, "threads": 1},
}


def _row(name: str, timings: list[TurnTiming], wall: float, extra: dict[str, Any]) -> dict[str, Any]:
    row = {"name": name, **summarize(timings, wall), **extra}
    row["p99_over_p50"] = row["latency_p99_ms"] / row["latency_p50_ms"]
    return row


def _tiny_shape() -> Any:
    from benchmarks.realistic_model import ModelShape

    return ModelShape(n_layer=2, n_embd=64, n_head=4, n_head_kv=2, n_ff=128, n_vocab=512, context_length=4096)


def _model(args: argparse.Namespace, tmp: Path) -> str:
    if args.model:
        return str(args.model)
    from benchmarks.realistic_model import REALISTIC, write_realistic_model

    shape = _tiny_shape() if args.tiny else REALISTIC
    return str(write_realistic_model(tmp / "fleet.gguf", shape))


def _http(args: argparse.Namespace, sizes: dict[str, Any], slots: list[int]) -> dict[str, Any]:
    """The fleet's sizes as a chat fleet over HTTP: kvres serve against llama-server."""
    from benchmarks.chat_fleet.__main__ import Settings, run
    from benchmarks.chat_fleet.workload import ChatWorkload

    w = ChatWorkload(conversations=sizes["sessions"], slots=min(slots), clients=sizes["users"], turns=sizes["turns"],
                     history_tokens=sizes["history"], user_tokens=sizes["user_tokens"],
                     reply_tokens=sizes["reply_tokens"])
    preset = "large" if args.large else "tiny" if args.tiny else "default"
    return run(Settings(config=preset, workload=w, model_kind="realistic", model=args.model,
                        shape=_tiny_shape() if args.tiny else None, threads=int(sizes["threads"]),
                        repeats=args.repeats, kv_layout=args.kv_layout), args.out, stem="fleet-http")


def _median_row(rs: list[dict[str, Any]]) -> dict[str, Any]:
    """The run of median turns/s, with every run's turns/s."""
    row = dict(sorted(rs, key=lambda r: r["turns_per_s"])[(len(rs) - 1) // 2])
    row["runs_turns_per_s"] = [r["turns_per_s"] for r in rs]
    return row


def _ratios(rows: dict[str, dict[str, Any]], slots: list[int], runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Each ratio as the median of the repeats' paired ratios (each kvres run over the baselines
    measured just before it)."""
    few, many = min(slots), max(slots)
    out: dict[str, Any] = {}

    def paired(k: str, base: str) -> float:
        return statistics.median(r["turns_per_s"] / x["turns_per_s"]
                                 for r, x in zip(runs[k], runs[base], strict=True))

    for n in slots:
        k = f"kvres_{n}_slots"
        out[f"{k}_over_slot_baseline"] = paired(k, "slot_baseline")
        out[f"{k}_over_reprefill"] = paired(k, "reprefill_baseline")
        out[f"{k}_over_llama_batch"] = paired(k, "llama_batch") if "llama_batch" in runs else None
        out[f"{k}_p99_over_p50"] = rows[k]["p99_over_p50"]
    # what the engine itself makes of the same turns: llama.cpp batching them with every session resident
    # (at most as many turns at once as the fewest slots allow, and as all users ask); a bar above these is
    # out of this engine's reach on this host, whatever the server in front of it does
    bounded = f"llama_batch_{few}_at_once" if f"llama_batch_{few}_at_once" in runs else "llama_batch"
    if "llama_batch" in runs:
        out[f"kvres_{few}_slots_over_{bounded}"] = paired(f"kvres_{few}_slots", bounded)
        out["engine_bounds"] = {
            f"{bounded}_over_slot_baseline": paired(bounded, "slot_baseline"),
            f"{bounded}_over_reprefill": paired(bounded, "reprefill_baseline"),
            "llama_batch_over_slot_baseline": paired("llama_batch", "slot_baseline"),
        }
    few_row = rows[f"kvres_{few}_slots"]
    out["acceptance"] = {
        "few_slots_ge_1.5x_slot_baseline": out[f"kvres_{few}_slots_over_slot_baseline"] >= 1.5,
        "few_slots_ge_5x_reprefill": out[f"kvres_{few}_slots_over_reprefill"] >= 5.0,
        "few_slots_p99_le_3x_p50": few_row["p99_over_p50"] <= 3.0,
        "few_slots_no_failed_turns": few_row["failed_turns"] == 0,
        "all_slots_ge_2x_slot_baseline": out[f"kvres_{many}_slots_over_slot_baseline"] >= 2.0,
        "all_slots_ge_0.8x_llama_batch": None if out[f"kvres_{many}_slots_over_llama_batch"] is None
        else out[f"kvres_{many}_slots_over_llama_batch"] >= 0.8,
    }
    if "kvres_mixed_high" in rows:
        out["mixed_high_p99_over_p50"] = rows["kvres_mixed_high"]["p99_over_p50"]
        out["acceptance"]["mixed_high_p99_le_1.5x_p50"] = out["mixed_high_p99_over_p50"] <= 1.5
        out["acceptance"]["mixed_low_all_complete"] = rows["kvres_mixed_low"]["failed_turns"] == 0
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    preset = parser.add_mutually_exclusive_group()
    preset.add_argument("--large", action="store_true", help="bigger sizes, for a machine with more cores")
    preset.add_argument("--tiny", action="store_true", help="a tiny model and sizes (the test)")
    parser.add_argument("--engine", choices=tuple(BASELINES), default="llama",
                        help="the backends' engine and the baselines' (openvino: state mode, no batching baseline)")
    parser.add_argument("--model", type=Path, default=None)
    for name in PRESETS["default"]:
        parser.add_argument(f"--{name.replace('_', '-')}", type=str if name == "slots" else int, default=None)
    parser.add_argument("--open-repeats", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=1,
                        help="runs of the baselines and kvres, alternating (medians reported)")
    parser.add_argument("--two-calls", action="store_true",
                        help="each kvres turn as two calls (append, then stream) instead of one stream(prompt=...)")
    parser.add_argument("--high", type=int, default=None,
                        help="a mixed run over the fewest slots: this many sessions at priority 1, the rest at 0 "
                             "(default 4, 1 with --tiny; 0: none)")
    parser.add_argument("--kv-layout", choices=("unified", "split"), default="split",
                        help="the kvres backends' llama.cpp KV layout (BackendConfig.kv_layout; split, the default: "
                             "one stream per session, what many resident chat sessions run fastest on)")
    parser.add_argument("--http", action="store_true",
                        help="the same sizes over HTTP: kvres serve (the fewest --slots) against llama-server "
                             "(benchmarks.chat_fleet; `make peers` first)")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = parser.parse_args(argv)
    if args.http and args.engine != "llama":
        parser.error("--http runs llama-server beside kvres: --engine llama only")
    if args.high is None:
        args.high = 1 if args.tiny else 4
    sizes = dict(PRESETS["large" if args.large else "tiny" if args.tiny else "default"])
    sizes.update({k: v for k, v in vars(args).items() if k in sizes and v is not None})
    slots = sorted(int(x) for x in str(sizes["slots"]).split(","))
    w = Workload(**{k: sizes[k] for k in ("sessions", "history", "turns", "user_tokens", "reply_tokens", "users")})
    shared = replace(w, shared_prefix=min(int(sizes["shared_prefix"]), w.history))
    threads = int(sizes["threads"])
    if args.http:
        return _http(args, sizes, slots)
    slot_run, reprefill_run, batch_run = BASELINES[args.engine]

    import ray

    from kvres.actors.engines.llama.engine import LlamaModel
    from kvres.cluster import KvresConfig, connect

    with tempfile.TemporaryDirectory(prefix="kvres-fleet-") as tmp:
        model = _model(args, Path(tmp))
        vocab = LlamaModel(model).n_vocab
        runs: dict[str, list[dict[str, Any]]] = {}

        def measure(name: str, outcome: tuple[list[TurnTiming], float, dict[str, Any]]) -> None:
            runs.setdefault(name, []).append(_row(name, *outcome))

        backends = {n: f"fleet-{n}" for n in slots}
        config = KvresConfig(backends=[backend_config(w, n, model, threads, name, args.engine, args.kv_layout)
                                       for n, name in backends.items()])
        probe_cache = Path(tmp) / "probe-cache"  # a fresh machine: nothing measured here yet
        os.environ["KVRES_CACHE_DIR"] = str(probe_cache)
        manager = connect(namespace=f"kvres-fleet-{uuid.uuid4().hex[:6]}", config=config,
                          include_dashboard=False, num_cpus=max(2, threads),
                          runtime_env={"env_vars": {"KVRES_CACHE_DIR": str(probe_cache)}})
        try:
            first = first_turns(manager, w, backends[min(slots)], vocab)  # before the probes are done
            for _ in range(args.repeats):  # alternating, so the host's drift hits every system alike
                measure("reprefill_baseline", reprefill_run(
                    model, w, threads, min(w.sessions, int(sizes["reprefill_sessions"]))))
                measure("slot_baseline", slot_run(model, w, threads))
                if batch_run is not None:
                    measure("llama_batch", batch_run(model, w, threads))
                    if min(slots) < w.users:  # the engine's own bound with as few sequence slots as kvres's fewest
                        measure(f"llama_batch_{min(slots)}_at_once", batch_run(model, w, threads, min(slots)))
                for n, name in backends.items():
                    measure(f"kvres_{n}_slots", kvres_fleet(manager, w, name, vocab, args.two_calls))
            few = backends[min(slots)]
            measure("kvres_shared_prefix", kvres_fleet(manager, shared, few, vocab, args.two_calls))
            if args.high:  # mixed priorities over the fewest slots: high and low turns apart
                timings, wall, extra = kvres_fleet(manager, w, few, vocab, args.two_calls, high=args.high)
                for name, high in (("kvres_mixed_high", True), ("kvres_mixed_low", False)):
                    part = [t for t in timings if (t.session < args.high) == high]
                    failed = [i for i in extra["failed_sessions"] if (i < args.high) == high]
                    measure(name, (part, wall, {**extra, "failed_turns": len(failed)}))
            opening = open_cost(manager, shared, few, vocab, args.open_repeats)
        finally:
            manager.shutdown()
            ray.shutdown()
            os.environ.pop("KVRES_CACHE_DIR", None)
    rows = {name: _median_row(rs) for name, rs in runs.items()}
    result = {"model": str(args.model) if args.model else "random weights (benchmarks.realistic_model)",
              "preset": "large" if args.large else "tiny" if args.tiny else "default", "threads": threads,
              "workload": asdict(w), "turn_calls": 2 if args.two_calls else 1, "shared_prefix": shared.shared_prefix, "slots": slots,
              "kv_layout": args.kv_layout if args.engine == "llama" else None, "repeats": args.repeats, "rows": rows,
              "ratios": _ratios(rows, slots, runs),
              "shared_prefix_open": opening, "first_turns": first}
    result["ratios"]["acceptance"]["first_turn_le_2x_later"] = first["ratio"] <= 2.0
    if args.engine != "llama":
        result = {"engine": args.engine, **result, **ENGINE_NOTES[args.engine]}
    for r in rows.values():
        print(f"{r['name']:>22}: {r['turns_per_s']:6.2f} turns/s, ttft p50 {r['ttft_p50_ms']:7.1f} ms, "
              f"latency p50 {r['latency_p50_ms']:7.1f} / p99 {r['latency_p99_ms']:7.1f} ms")
    print(json.dumps(result["ratios"], indent=1))
    print("shared prefix open:", opening)
    print(f"first turn on a fresh backend: {first['first_turn_s'] * 1e3:.0f} ms, later ones "
          f"{first['later_turn_median_s'] * 1e3:.0f} ms ({first['ratio']:.2f}x)")
    name = "fleet" if args.engine == "llama" else f"fleet-{args.engine}"
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{name}.json").write_text(json.dumps(result, indent=2))
    _plot(rows, args.out / f"{name}.png")
    return result


def _plot(rows: dict[str, dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(rows)
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    ax1.bar(names, [rows[n]["turns_per_s"] for n in names], color="tab:blue")
    ax1.set_ylabel("turns/s")
    ax1.tick_params(axis="x", rotation=30)
    x = range(len(names))
    ax2.bar([i - 0.2 for i in x], [rows[n]["latency_p50_ms"] for n in names], width=0.4, label="turn p50")
    ax2.bar([i + 0.2 for i in x], [rows[n]["latency_p99_ms"] for n in names], width=0.4, label="turn p99")
    ax2.plot(list(x), [rows[n]["ttft_p50_ms"] for n in names], "k^", label="TTFT p50")
    ax2.set_xticks(list(x), names, rotation=30)
    ax2.set_ylabel("ms")
    ax2.set_yscale("log")
    ax2.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)


if __name__ == "__main__":
    main()
