"""Eviction mechanism cost on the same plans: OpenVINO recompute vs OpenVINO state vs llama.cpp shift.

Run: ``.venv/bin/python -m benchmarks.openvino_mechanism [--out DIR] [--model GGUF] [--repeats N]``
Writes ``openvino_mechanism.json`` and ``openvino_mechanism.png`` into ``DIR`` (default
benchmarks/results).

For each context length and plan (StreamingLLM with re-basing; recency with a position gap), one
session is prefilled, the planner's plan is made once, and the time from "apply the plan" to "next
token's logits ready" (the plan's evictions plus one decode step) is measured on:
- ``ov_recompute``: ``openvino_executor(mode="recompute")`` (drop the evicted ranges; the
  survivors are re-prefilled once, at the next decode),
- ``ov_state``: ``openvino_executor(mode="state")`` (slice the KV states, rotate kept keys in numpy),
- ``llama_shift``: llama.cpp's native ``llama_memory_seq_rm`` + ``llama_memory_seq_add``.
The plan-only time (``apply_seconds``) is reported too; for recompute it hides the deferred
re-prefill. Each point is the median over ``--repeats`` fresh prefills (prefill excluded). The ratios
``ov_recompute / llama_shift``, ``ov_state / llama_shift`` and ``ov_recompute / ov_state`` come from
the same run. The next-token logits after each plan are also compared with llama's (max |diff|):
state mode does what llama.cpp does (~1e-5); recompute mode differs by design, because the
survivors' KV is recomputed without the evicted tokens while llama keeps their original KV.
All engines run single-threaded with f32 KV.

A second section (``engine_eviction``, see ``engine_eviction.py``) sets OpenVINO's own eviction in
openvino-genai (``CacheEvictionConfig``, SUM / NORM_SUM) beside kvres's StreamingLLM plan on the
state mechanism: time per generated token and agreement with the full-cache continuation.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path
from typing import Any

import numpy as np

from kvres.actors.engines.executor import apply_plan
from kvres.policy import Block, PlanInput, StreamPolicy, plan_hot_set, split_into_blocks

from .engine_eviction import compare_engine_eviction
from .llama_native import LlamaNative, NativeSession

DEFAULT_MODEL = Path(__file__).resolve().parents[2].parent / "shared" / "models" / "stories260K.gguf"
BLOCK = 16


def _prompt(n: int) -> list[int]:
    rng = np.random.default_rng(n)
    return [1] + rng.integers(3, 500, n - 1).tolist()


def _plans(n: int) -> dict[str, tuple[int, StreamPolicy]]:
    return {
        "streaming-rebase": (n // 4, StreamPolicy(True, sink_tokens=4, recent_tokens=n // 8)),
        "recency-gap": (n // 2, StreamPolicy()),
    }


def _measure(model: Path, n: int, name: str, budget: int, stream: StreamPolicy, repeats: int,
             native: LlamaNative) -> dict[str, Any]:
    from kvres.actors.engines.openvino import openvino_executor

    prompt = _prompt(n)
    keys = ("ov_recompute", "ov_state", "llama_shift")
    times: dict[str, list[float]] = {k: [] for k in keys}
    apply_times: dict[str, list[float]] = {k: [] for k in keys}
    logits: dict[str, np.ndarray] = {}
    plan = None
    for _ in range(repeats):
        for mode in ("recompute", "state"):
            ex = openvino_executor(model, mode=mode)
            ex.open_session("s")
            ex.append("s", prompt)
            if plan is None:
                blocks = [Block(b.range, last_used=i)
                          for i, b in enumerate(split_into_blocks(ex.resident_ranges("s"), BLOCK))]
                plan = plan_hot_set(PlanInput(blocks, budget, stream, ex.capabilities()))
            t0 = time.perf_counter()
            apply_plan(ex, "s", plan)
            t1 = time.perf_counter()
            logits[f"ov_{mode}"] = ex.append("s", [5])
            times[f"ov_{mode}"].append(time.perf_counter() - t0)
            apply_times[f"ov_{mode}"].append(t1 - t0)
        session = NativeSession(native)
        session.append(prompt)
        t0 = time.perf_counter()
        for rng in reversed(plan.evict_ranges):
            session.evict_range(rng, rebase=plan.rebase_positions)
        t1 = time.perf_counter()
        logits["llama_shift"] = session.append([5])
        times["llama_shift"].append(time.perf_counter() - t0)
        apply_times["llama_shift"].append(t1 - t0)
    med = {k: float(np.median(v)) for k, v in times.items()}
    assert plan is not None
    return {
        "context": n, "plan": name, "budget": budget, "rebase": plan.rebase_positions,
        "evicted_tokens": int(sum(len(r) for r in plan.evict_ranges)),
        "evicted_ranges": len(plan.evict_ranges),
        "seconds": med,
        "apply_seconds": {k: float(np.median(v)) for k, v in apply_times.items()},
        "ratios": {
            "ov_recompute/llama_shift": med["ov_recompute"] / med["llama_shift"],
            "ov_state/llama_shift": med["ov_state"] / med["llama_shift"],
            "ov_recompute/ov_state": med["ov_recompute"] / med["ov_state"],
        },
        "max_abs_logit_diff_vs_llama": {
            k: float(np.abs(logits[k] - logits["llama_shift"]).max()) for k in ("ov_recompute", "ov_state")
        },
    }


def _plot(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
    for ax, plan in zip(axes, ("streaming-rebase", "recency-gap"), strict=True):
        sel = [r for r in rows if r["plan"] == plan]
        ctx = [r["context"] for r in sel]
        for key, style in (("ov_recompute", "o-"), ("ov_state", "s-"), ("llama_shift", "^-")):
            ax.plot(ctx, [r["seconds"][key] * 1e3 for r in sel], style, label=key)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_title(f"{plan}: plan applied + next token")
        ax.set_xlabel("context tokens (prefilled)")
        ax.grid(True, which="both", alpha=0.3)
    axes[0].set_ylabel("ms (median)")
    axes[0].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--contexts", type=int, nargs="+", default=[256, 512, 1024])
    parser.add_argument("--no-genai", action="store_true", help="skip the openvino-genai comparison")
    args = parser.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    rows = []
    with LlamaNative(args.model, n_ctx=max(args.contexts) + 64) as native:
        for n in args.contexts:
            for name, (budget, stream) in _plans(n).items():
                rows.append(_measure(args.model, n, name, budget, stream, args.repeats, native))
                r = rows[-1]
                print(f"{n:5d} {name:17s} " + "  ".join(f"{k} {v * 1e3:8.3f} ms" for k, v in r["seconds"].items())
                      + "  |  " + "  ".join(f"{k} {v:7.1f}" for k, v in r["ratios"].items()))
    engine_eviction = None
    if not args.no_genai:
        import tempfile

        from kvres.actors.engines.openvino.genai import export_genai_model

        with tempfile.TemporaryDirectory() as tmp:
            genai_dir = export_genai_model(args.model, Path(tmp) / "genai")
            engine_eviction = compare_engine_eviction(args.model, genai_dir)
        for name, m in engine_eviction["methods"].items():
            print(f"{name:15s} {m['ms_per_token_incl_prefill']:7.2f} ms/token  "
                  f"agrees with full cache for {m['agree_with_full_cache']} tokens")
    result = {
        "benchmark": "openvino_mechanism",
        "model": str(args.model),
        "repeats": args.repeats,
        "host": {"machine": platform.machine(), "python": platform.python_version(), "threads": 1},
        "rows": rows,
        "engine_eviction": engine_eviction,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "openvino_mechanism.json").write_text(json.dumps(result, indent=2))
    _plot(rows, args.out / "openvino_mechanism.png")
    print(f"wrote {args.out / 'openvino_mechanism.json'} and {args.out / 'openvino_mechanism.png'}")
    return result


if __name__ == "__main__":
    main()
