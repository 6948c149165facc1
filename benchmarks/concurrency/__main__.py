"""Many sessions on one backend through the Session API, beside llama.cpp batching them itself.

Run: ``.venv/bin/python -m benchmarks.concurrency [--engine llama|openvino] [--model PATH]
[--sessions 1,2,4,8,16] [--tokens 128] [--prompt 200] [--threads 2] [--repeats 5] [--out DIR]``
Writes ``concurrency.json`` and ``concurrency.png`` (``concurrency-openvino.*`` with
``--engine openvino``) into DIR (default benchmarks/results).

For each N: N sessions, each with its own ``prompt``-token prompt, each calling
``generate(tokens)`` from its own driver thread at the same time: aggregate tokens/s (N * tokens /
wall time of the slowest). Then the same N sessions each ``stream`` their next ``tokens`` tokens:
p50 / p99 of the time between a session's consecutive tokens. The baseline, measured in the same
run on the same model and threads:
- llama: llama.cpp itself decoding the same N sequences, one ``llama_decode`` per step holding one
  token of every sequence (greedy, no Ray, no kvres): what the engine can do on this machine;
- openvino (state mode): the same N sessions on the same backend, each generating its ``tokens``
  after the other's, through the same API: what concurrency must at least match (the stateful IR
  takes one sequence per request, so sessions cannot share a batch).
Each N is measured ``repeats`` times, kvres and baseline alternating so machine noise hits both
alike; medians are reported: kvres / baseline at each N (the ratio of the medians, and the median
of each run's ratio to the baseline run just before it, which the host's drift between repeats
moves less), and kvres at N / kvres at 1.
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
BASELINES = {"llama": "llama.cpp batch (engine limit)", "openvino": "the same sessions one after another"}


def prompt(i: int, n: int, vocab: int) -> list[int]:
    rng = np.random.default_rng(i)
    return [int(t) for t in rng.integers(3, vocab, size=n)]


def engine_baseline(model: str, n: int, prompt_len: int, tokens: int, threads: int) -> float:
    """Tokens/s of llama.cpp decoding ``n`` sequences in one batch per step (prefill excluded)."""
    from kvres.actors.engines.llama.engine import LlamaContext, LlamaModel

    m = LlamaModel(model)
    ctx = LlamaContext(m, n_ctx=n * (prompt_len + tokens) + 64, n_seq_max=n, n_batch=512, n_threads=threads)
    try:
        prompts = [prompt(i, prompt_len, m.n_vocab) for i in range(n)]
        logits = ctx.decode_many([(p, 0, i) for i, p in enumerate(prompts)])
        t0 = time.perf_counter()
        for step in range(tokens):
            nxt = [int(np.argmax(lg)) for lg in logits]
            logits = ctx.decode_many([([t], prompt_len + step, i) for i, t in enumerate(nxt)])
        return n * tokens / (time.perf_counter() - t0)
    finally:
        ctx.close()
        m.close()


def _threads(fn: Any, n: int) -> list[Any]:
    out: list[Any] = [None] * n
    threads = [threading.Thread(target=lambda i=i: out.__setitem__(i, fn(i))) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def kvres_run(manager: Any, n: int, prompt_len: int, tokens: int, vocab: int) -> dict[str, float]:
    sessions = [manager.open_session(backend="bench") for _ in range(n)]
    try:
        for i, s in enumerate(sessions):
            s.append(prompt(i, prompt_len, vocab))
        t0 = time.perf_counter()
        outs = _threads(lambda i: sessions[i].generate(tokens), n)
        wall = time.perf_counter() - t0
        assert all(len(o) == tokens for o in outs)

        def gaps(i: int) -> list[float]:
            stamps = [time.perf_counter()]
            for _ in sessions[i].stream(tokens):
                stamps.append(time.perf_counter())
            return [b - a for a, b in zip(stamps[1:], stamps[2:], strict=False)]

        every = [g for per in _threads(gaps, n) for g in per]
        return {
            "tokens_per_s": n * tokens / wall,
            "p50_ms_per_token": statistics.median(every) * 1e3,
            "p99_ms_per_token": float(np.percentile(every, 99)) * 1e3,
        }
    finally:
        for s in sessions:
            s.close()


def sequential_baseline(manager: Any, n: int, prompt_len: int, tokens: int, vocab: int) -> float:
    """Tokens/s of ``n`` sessions each generating ``tokens``, one after another (prefill excluded)."""
    sessions = [manager.open_session(backend="bench") for _ in range(n)]
    try:
        for i, s in enumerate(sessions):
            s.append(prompt(i, prompt_len, vocab))
        t0 = time.perf_counter()
        for s in sessions:
            assert len(s.generate(tokens)) == tokens
        return n * tokens / (time.perf_counter() - t0)
    finally:
        for s in sessions:
            s.close()


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine", choices=("llama", "openvino"), default="llama")
    parser.add_argument("--model", default=str(ROOT / "models" / "passkey.gguf"))
    parser.add_argument("--sessions", default="1,2,4,8,16")
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--prompt", type=int, default=200)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = parser.parse_args(argv)
    counts = [int(x) for x in args.sessions.split(",")]

    import ray

    from kvres.actors.engines.llama.engine import LlamaModel
    from kvres.cluster import BackendConfig, KvresConfig, connect

    vocab = LlamaModel(args.model).n_vocab
    top = max(counts)
    n_ctx = top * (args.prompt + 2 * args.tokens) + 64
    n_ctx += n_ctx % 2
    engine_options: dict[str, Any] = {"engine": "openvino", "openvino_mode": "state"} if args.engine == "openvino" else {}
    config = KvresConfig(backends=[BackendConfig(
        name="bench", model_path=args.model, n_ctx=n_ctx, n_seq_max=min(64, top),
        kv_budget_tokens=n_ctx, n_threads=args.threads, **engine_options)])
    manager = connect(namespace=f"kvres-bench-{uuid.uuid4().hex[:6]}", config=config,
                      include_dashboard=False, num_cpus=2)
    rows = []
    try:
        kvres_run(manager, 1, args.prompt, 8, vocab)  # warm-up
        for n in counts:
            baselines, runs = [], []
            for _ in range(args.repeats):
                if args.engine == "llama":
                    baselines.append(engine_baseline(args.model, n, args.prompt, args.tokens, args.threads))
                else:
                    baselines.append(sequential_baseline(manager, n, args.prompt, args.tokens, vocab))
                runs.append(kvres_run(manager, n, args.prompt, args.tokens, vocab))
            base = statistics.median(baselines)
            row = {"sessions": n, "baseline_tokens_per_s": base,
                   **{k: statistics.median(r[k] for r in runs) for k in runs[0]},
                   "runs": runs, "baseline_runs": baselines}
            row["ratio_to_baseline"] = row["tokens_per_s"] / base
            # each kvres run over the baseline run just before it: drift between repeats cancels
            row["paired_ratio_to_baseline"] = statistics.median(
                r["tokens_per_s"] / b for r, b in zip(runs, baselines, strict=True))
            if args.engine == "llama":  # the baseline is the engine's own batch
                row["engine_tokens_per_s"], row["ratio_to_engine"] = base, row["ratio_to_baseline"]
            rows.append(row)
            print(f"N={n:3d}: kvres {row['tokens_per_s']:8.0f} tok/s, {BASELINES[args.engine]} {base:8.0f} tok/s, "
                  f"ratio {row['ratio_to_baseline']:.2f} (paired {row['paired_ratio_to_baseline']:.2f}), p50 {row['p50_ms_per_token']:.2f} ms, "
                  f"p99 {row['p99_ms_per_token']:.2f} ms")
    finally:
        manager.shutdown()
        ray.shutdown()
    one = next((r["tokens_per_s"] for r in rows if r["sessions"] == 1), None)
    for r in rows:
        r["speedup_over_one_session"] = r["tokens_per_s"] / one if one else None
    result = {"engine": args.engine, "baseline": BASELINES[args.engine], "model": args.model,
              "tokens": args.tokens, "prompt": args.prompt, "threads": args.threads, "rows": rows}
    name = "concurrency" if args.engine == "llama" else f"concurrency-{args.engine}"
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{name}.json").write_text(json.dumps(result, indent=2))
    _plot(rows, args.out / f"{name}.png", BASELINES[args.engine])
    return result


def _plot(rows: list[dict[str, Any]], path: Path, baseline: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = [r["sessions"] for r in rows]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    ax1.plot(n, [r["tokens_per_s"] for r in rows], "o-", label="kvres (Session API)")
    ax1.plot(n, [r["baseline_tokens_per_s"] for r in rows], "s--", label=baseline)
    ax1.set_xscale("log", base=2)
    ax1.set_xlabel("concurrent sessions")
    ax1.set_ylabel("aggregate tokens/s")
    ax1.legend()
    ax2.plot(n, [r["p50_ms_per_token"] for r in rows], "o-", label="p50")
    ax2.plot(n, [r["p99_ms_per_token"] for r in rows], "o-", label="p99")
    ax2.set_xscale("log", base=2)
    ax2.set_xlabel("concurrent sessions")
    ax2.set_ylabel("ms between a session's tokens")
    ax2.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)


if __name__ == "__main__":
    main()
