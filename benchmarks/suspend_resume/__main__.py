"""Suspend + resume through the Session API, beside llama-cpp-python's own save/load and a re-prefill.

Run: ``.venv/bin/python -m benchmarks.suspend_resume [--model PATH] [--lengths 256,1000,4000]
[--repeats 5] [--threads 2] [--out DIR]``
Writes ``suspend_resume.json`` and ``suspend_resume.png`` into DIR (default benchmarks/results).

For each session length L (random token ids of the model's vocabulary), in the same run:
- kvres: ``session.suspend()`` + ``session.resume()`` of an L-token session (its KV goes to the
  node's cold store and back), the median of ``repeats``;
- llama-cpp-python: ``Llama.save_state()`` + ``Llama.load_state()`` of the same L tokens, the
  engine's own copy of its state (in-process, no store);
- re-prefill: a new session appending the same L tokens through the API (what a resume without
  the cold store would cost).
- the floor: two empty calls to the same backend actor (``ping``), what any suspend + resume
  through Ray costs before it does anything.
Reported: (suspend + resume) / (save + load), the same less the floor, and re-prefill / resume.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[2]


def tokens_of(n: int, vocab: int, seed: int = 0) -> list[int]:
    return [int(t) for t in np.random.default_rng(seed).integers(3, vocab, size=n)]


def engine_save_load(model: str, tokens: list[int], n_ctx: int, threads: int, repeats: int) -> dict[str, float]:
    from llama_cpp import Llama

    llm = Llama(model_path=model, n_ctx=n_ctx, n_threads=threads, n_batch=512, verbose=False)
    llm.eval(tokens)
    saves, loads, size = [], [], 0
    for _ in range(repeats + 1):
        t0 = time.perf_counter()
        state = llm.save_state()
        t1 = time.perf_counter()
        llm.load_state(state)
        t2 = time.perf_counter()
        saves.append(t1 - t0)
        loads.append(t2 - t1)
        size = int(state.llama_state_size)
    llm.close()
    return {"save_s": statistics.median(saves[1:]), "load_s": statistics.median(loads[1:]), "state_bytes": size}


def ray_floor(manager: Any, repeats: int) -> float:
    """Median time of two empty calls to the backend actor (a suspend and a resume are two calls)."""
    import ray

    handle = manager.backend_handle("bench")
    times = []
    for _ in range(max(20, repeats * 4)):
        t0 = time.perf_counter()
        ray.get(handle.ping.remote())
        ray.get(handle.ping.remote())
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def kvres_cycle(manager: Any, tokens: list[int], repeats: int) -> dict[str, float]:
    session = manager.open_session(backend="bench")
    session.append(tokens)
    suspends, resumes, recomputed = [], [], 0
    for _ in range(repeats + 1):
        t0 = time.perf_counter()
        session.suspend()
        t1 = time.perf_counter()
        recomputed += session.resume()
        t2 = time.perf_counter()
        suspends.append(t1 - t0)
        resumes.append(t2 - t1)
    session.close()
    prefills = []
    for _ in range(max(1, repeats // 2)):
        fresh = manager.open_session(backend="bench")
        t0 = time.perf_counter()
        fresh.append(tokens)
        prefills.append(time.perf_counter() - t0)
        fresh.close()
    return {"suspend_s": statistics.median(suspends[1:]), "resume_s": statistics.median(resumes[1:]),
            "reprefill_s": statistics.median(prefills), "recomputed_tokens": recomputed}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=str(ROOT / "models" / "passkey.gguf"))
    parser.add_argument("--lengths", default="256,1000,4000")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = parser.parse_args(argv)
    lengths = [int(x) for x in args.lengths.split(",")]

    import ray

    from kvres.actors.engines.llama.engine import LlamaModel
    from kvres.cluster import BackendConfig, ColdStoreConfig, KvresConfig, connect

    vocab = LlamaModel(args.model).n_vocab
    n_ctx = max(lengths) + 64
    n_ctx += n_ctx % 2
    config = KvresConfig(
        backends=[BackendConfig(name="bench", model_path=args.model, n_ctx=n_ctx, n_seq_max=2,
                                kv_budget_tokens=n_ctx, n_threads=args.threads)],
        cold_store=ColdStoreConfig(ram_budget_bytes=256 << 20, disk_budget_bytes=256 << 20),
    )
    manager = connect(namespace=f"kvres-bench-{uuid.uuid4().hex[:6]}", config=config,
                      include_dashboard=False, num_cpus=2)
    rows = []
    try:
        for n in lengths:
            toks = tokens_of(n, vocab)
            engine = engine_save_load(args.model, toks, n_ctx, args.threads, args.repeats)
            ours = kvres_cycle(manager, toks, args.repeats)
            floor = ray_floor(manager, args.repeats)
            row = {"tokens": n, **engine, **ours, "ray_floor_s": floor}
            cycle, save_load = ours["suspend_s"] + ours["resume_s"], engine["save_s"] + engine["load_s"]
            row["cycle_over_engine"] = cycle / save_load
            row["cycle_less_floor_over_engine"] = max(0.0, cycle - floor) / save_load
            row["reprefill_over_resume"] = ours["reprefill_s"] / ours["resume_s"]
            rows.append(row)
            print(f"{n:5d} tokens: suspend {ours['suspend_s'] * 1e3:.2f} + resume {ours['resume_s'] * 1e3:.2f} ms; "
                  f"save {engine['save_s'] * 1e3:.2f} + load {engine['load_s'] * 1e3:.2f} ms "
                  f"(x{row['cycle_over_engine']:.2f}; two empty Ray calls {floor * 1e3:.2f} ms, "
                  f"x{row['cycle_less_floor_over_engine']:.2f} without them); re-prefill {ours['reprefill_s'] * 1e3:.1f} ms "
                  f"({row['reprefill_over_resume']:.0f}x resume)")
    finally:
        manager.shutdown()
        ray.shutdown()
    result = {"model": args.model, "threads": args.threads, "repeats": args.repeats, "rows": rows}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "suspend_resume.json").write_text(json.dumps(result, indent=2))
    _plot(rows, args.out / "suspend_resume.png")
    return result


def _plot(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    x = np.arange(len(rows))
    fig, ax = plt.subplots(figsize=(8, 4))
    ax.bar(x - 0.27, [(r["suspend_s"] + r["resume_s"]) * 1e3 for r in rows], 0.27, label="kvres suspend + resume")
    ax.bar(x, [(r["save_s"] + r["load_s"]) * 1e3 for r in rows], 0.27, label="llama-cpp-python save + load")
    ax.bar(x + 0.27, [r["reprefill_s"] * 1e3 for r in rows], 0.27, label="re-prefill through the API")
    ax.set_xticks(x, [f"{r['tokens']} tokens" for r in rows])
    ax.set_yscale("log")
    ax.set_ylabel("ms")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)


if __name__ == "__main__":
    main()
