"""Suspend + resume through the Session API, beside llama-cpp-python's own save/load and a re-prefill.

Run: ``.venv/bin/python -m benchmarks.suspend_resume [--model PATH | --realistic] [--lengths 256,1000,4000]
[--repeats 5] [--threads 2] [--out DIR]``
Writes ``suspend_resume.json`` and ``suspend_resume.png`` into DIR (default benchmarks/results).
``--realistic``: a random-weight llama of a realistic shape (``benchmarks.realistic_model``: 12
layers, hidden 768, 12 query heads over 4 KV heads, 32,000 tokens; 12 KiB of f16 KV a token),
written to a temporary folder, instead of ``--model``.

For each session length L (random token ids of the model's vocabulary), in the same run, the
repeats of the two sides interleaved (one kvres cycle, then one engine cycle, ``repeats`` times
after one warm-up of each), medians reported:
- kvres: ``session.suspend()`` + ``session.resume()`` of an L-token session (its KV goes to the
  node's cold store's port and back);
- llama-cpp-python: ``Llama.save_state()`` + ``Llama.load_state()`` of the same L tokens, the
  engine's own copy of its state (in-process, no store);
- re-prefill: a new session appending the same L tokens through the API (what a resume without
  the cold store would cost).
- the floor: two empty calls to the same backend actor (``ping``), what any suspend + resume
  through Ray costs before it does anything.
Reported: (suspend + resume) / (save + load), the same less the floor, and re-prefill / resume;
the machine's load average (1 minute) before and after each length and its CPU count.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[2]


def tokens_of(n: int, vocab: int, seed: int = 0) -> list[int]:
    return [int(t) for t in np.random.default_rng(seed).integers(3, vocab, size=n)]


class EngineSide:
    """llama-cpp-python holding the same L tokens: one ``save_state`` + ``load_state`` a ``cycle``."""

    def __init__(self, model: str, tokens: list[int], n_ctx: int, threads: int) -> None:
        from llama_cpp import Llama

        self.llm = Llama(model_path=model, n_ctx=n_ctx, n_threads=threads, n_batch=512, verbose=False)
        self.llm.eval(tokens)
        self.saves: list[float] = []
        self.loads: list[float] = []
        self.state_bytes = 0

    def cycle(self) -> None:
        t0 = time.perf_counter()
        state = self.llm.save_state()
        t1 = time.perf_counter()
        self.llm.load_state(state)
        t2 = time.perf_counter()
        self.saves.append(t1 - t0)
        self.loads.append(t2 - t1)
        self.state_bytes = int(state.llama_state_size)

    def result(self) -> dict[str, float]:
        self.llm.close()
        return {"save_s": statistics.median(self.saves[1:]), "load_s": statistics.median(self.loads[1:]),
                "state_bytes": self.state_bytes}


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


class KvresSide:
    """An L-token session through ``kvres.cluster``: one ``suspend`` + ``resume`` a ``cycle``."""

    def __init__(self, manager: Any, tokens: list[int]) -> None:
        self.manager, self.tokens = manager, tokens
        self.session = manager.open_session(backend="bench")
        self.session.append(tokens)
        self.suspends: list[float] = []
        self.resumes: list[float] = []
        self.recomputed = 0

    def cycle(self) -> None:
        t0 = time.perf_counter()
        self.session.suspend()
        t1 = time.perf_counter()
        self.recomputed += self.session.resume()
        t2 = time.perf_counter()
        self.suspends.append(t1 - t0)
        self.resumes.append(t2 - t1)

    def result(self, repeats: int) -> dict[str, float]:
        self.session.close()
        prefills = []
        for _ in range(max(1, repeats // 2)):
            fresh = self.manager.open_session(backend="bench")
            t0 = time.perf_counter()
            fresh.append(self.tokens)
            prefills.append(time.perf_counter() - t0)
            fresh.close()
        return {"suspend_s": statistics.median(self.suspends[1:]), "resume_s": statistics.median(self.resumes[1:]),
                "reprefill_s": statistics.median(prefills), "recomputed_tokens": self.recomputed}


def interleaved(manager: Any, model: str, tokens: list[int], n_ctx: int, threads: int,
                repeats: int) -> tuple[dict[str, float], dict[str, float]]:
    """(engine, kvres) medians of ``repeats`` cycles each (after one warm-up), taken in turn."""
    engine, ours = EngineSide(model, tokens, n_ctx, threads), KvresSide(manager, tokens)
    for _ in range(repeats + 1):
        ours.cycle()
        engine.cycle()
    return engine.result(), ours.result(repeats)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=str(ROOT / "models" / "passkey.gguf"))
    parser.add_argument("--realistic", action="store_true",
                        help="a random-weight model of a realistic shape (benchmarks.realistic_model) instead of --model")
    parser.add_argument("--lengths", default="256,1000,4000")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = parser.parse_args(argv)
    lengths = [int(x) for x in args.lengths.split(",")]
    if args.realistic:
        with tempfile.TemporaryDirectory(prefix="kvres-suspend-resume-") as tmp:
            from benchmarks.realistic_model import write_realistic_model

            args.model = str(write_realistic_model(Path(tmp) / "realistic.gguf"))
            return _run(args, lengths)
    return _run(args, lengths)


def _run(args: argparse.Namespace, lengths: list[int]) -> dict[str, Any]:
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
            load_before = os.getloadavg()[0]
            engine, ours = interleaved(manager, args.model, toks, n_ctx, args.threads, args.repeats)
            floor = ray_floor(manager, args.repeats)
            row = {"tokens": n, **engine, **ours, "ray_floor_s": floor, "load_before": load_before,
                   "load_after": os.getloadavg()[0]}
            cycle, save_load = ours["suspend_s"] + ours["resume_s"], engine["save_s"] + engine["load_s"]
            row["cycle_over_engine"] = cycle / save_load
            row["cycle_less_floor_over_engine"] = max(0.0, cycle - floor) / save_load
            row["reprefill_over_resume"] = ours["reprefill_s"] / ours["resume_s"]
            rows.append(row)
            print(f"{n:5d} tokens: suspend {ours['suspend_s'] * 1e3:.2f} + resume {ours['resume_s'] * 1e3:.2f} ms; "
                  f"save {engine['save_s'] * 1e3:.2f} + load {engine['load_s'] * 1e3:.2f} ms "
                  f"(x{row['cycle_over_engine']:.2f}; two empty Ray calls {floor * 1e3:.2f} ms, "
                  f"x{row['cycle_less_floor_over_engine']:.2f} without them); re-prefill {ours['reprefill_s'] * 1e3:.1f} ms "
                  f"({row['reprefill_over_resume']:.0f}x resume); load {load_before:.1f} -> {row['load_after']:.1f} "
                  f"on {os.cpu_count()} CPUs", flush=True)
    finally:
        manager.shutdown()
        ray.shutdown()
    result = {"model": "random weights (benchmarks.realistic_model)" if args.realistic else args.model,
              "threads": args.threads, "repeats": args.repeats, "interleaved": True, "cpus": os.cpu_count(),
              "rows": rows}
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
