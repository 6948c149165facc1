"""The first resume of a session on a fresh probe cache, against the resumes after it.

Run: ``.venv/bin/python -m benchmarks.first_resume [--tokens 2000] [--resumes 6] [--runs 3] [--threads 2]
[--layers 12 --hidden 768 --heads 12 --kv-heads 4 --ff 2048 --vocab 32000] [--model PATH] [--out DIR]``
Writes ``first_resume.json`` and ``first_resume.png`` into DIR (default benchmarks/results).

A backend measures its recall costs (prefill, block import, disk reads) when it starts, in the
background; a resume never waits for them (issue #27: the first resume on a fresh machine used to
run every probe inside the call). This benchmark checks that on a model of realistic shape:

- the model: a random-weight llama GGUF written by ``benchmarks.realistic_model`` (default 12
  layers, hidden 768, 12 query heads sharing 4 KV heads, vocabulary 32,000), unless ``--model``;
- a fresh probe cache (``KVRES_CACHE_DIR`` a new temporary folder, for the driver and every Ray
  worker) and a cold store whose disk tier is in another new temporary folder;
- a real local Ray cluster through ``kvres.cluster.connect``; one session, ``--tokens`` random token
  ids appended right after the cluster is up, then ``--resumes`` times ``suspend()`` +
  ``resume()`` (the session's KV goes to the node's cold store and back);
- all of it ``--runs`` times, each a new cluster on a new probe cache: one first resume is one
  sample of a call that takes milliseconds, so the first resumes' median is what is compared.

Reported: every resume's time, the median first resume, the median of the later ones and their
ratio (the bar: at most 2x), the append's time, where the backend's recall costs were at each resume
(``stats()["recall_costs"]``: "probing", then "measured") and when the probe was done, after the
last resume and after the backend started.
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
RATIO_BOUND = 2.0
PROBE_WAIT_S = 600.0  # after the resumes: how long to wait for the probe's figures, to report them


def _backend_stats(manager: Any) -> dict[str, Any]:
    import ray

    stats: dict[str, Any] = ray.get(manager.backend_handle("bench").stats.remote())
    return stats


def resume_cycles(manager: Any, tokens: list[int], resumes: int) -> dict[str, Any]:
    session = manager.open_session(backend="bench")
    t0 = time.perf_counter()
    session.append(tokens)
    append_s = time.perf_counter() - t0
    times, states, recomputed = [], [], 0
    for _ in range(resumes):
        session.suspend()
        states.append(_backend_stats(manager)["recall_costs"])
        t0 = time.perf_counter()
        recomputed += session.resume()
        times.append(time.perf_counter() - t0)
    session.close()
    return {"append_s": append_s, "resume_s": times, "recall_costs_at_resume": states,
            "recomputed_tokens": recomputed}


def _wait_for_probe(manager: Any) -> tuple[str, float]:
    t0 = time.perf_counter()
    state = _backend_stats(manager)["recall_costs"]
    while state == "probing" and time.perf_counter() - t0 < PROBE_WAIT_S:
        time.sleep(0.5)
        state = _backend_stats(manager)["recall_costs"]
    return state, time.perf_counter() - t0


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=2000)
    parser.add_argument("--resumes", type=int, default=6)
    parser.add_argument("--runs", type=int, default=3, help="fresh clusters, each on a fresh probe cache")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--hidden", type=int, default=768)
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--kv-heads", type=int, default=4)
    parser.add_argument("--ff", type=int, default=2048)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--model", type=Path, default=None, help="a GGUF to use instead of writing one")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = parser.parse_args(argv)
    if args.resumes < 2 or args.tokens < 1 or args.runs < 1:
        parser.error(f"--resumes must be >= 2, --tokens and --runs >= 1; got {args.resumes}, {args.tokens}, {args.runs}")

    from benchmarks.realistic_model import ModelShape, write_realistic_model

    shape = ModelShape(args.layers, args.hidden, args.heads, args.kv_heads, args.ff, args.vocab)
    with tempfile.TemporaryDirectory(prefix="kvres-first-resume-") as tmp:
        model = args.model or write_realistic_model(Path(tmp) / "realistic.gguf", shape)
        runs = []
        for i in range(args.runs):
            (Path(tmp) / f"run-{i}").mkdir()
            runs.append(_run(args, Path(model), Path(tmp) / f"run-{i}"))
            r = runs[-1]
            print(f"run {i + 1}: {args.tokens} tokens appended in {r['append_s']:.2f} s; resumes (ms) "
                  f"{', '.join(f'{t * 1e3:.1f}' for t in r['resume_s'])}, the first with recall costs "
                  f"{r['recall_costs_at_resume'][0]}; probe {r['probe_state']} {r['probe_wait_s']:.1f} s after the "
                  f"last resume, {r['probe_done_after_start_s']:.1f} s after the backend started", flush=True)
    firsts = [r["resume_s"][0] for r in runs]
    later = [t for r in runs for t in r["resume_s"][1:]]
    result = {
        "model": str(args.model) if args.model else "random weights (benchmarks.realistic_model)",
        "shape": None if args.model else {**shape.__dict__, "n_params": shape.n_params,
                                          "kv_bytes_per_token_f16": shape.kv_bytes_per_token()},
        "tokens": args.tokens, "threads": args.threads, "resumes": args.resumes, "runs": runs,
        "first_resume_s": statistics.median(firsts), "later_resume_median_s": statistics.median(later),
        "bound": RATIO_BOUND,
    }
    result["ratio"] = result["first_resume_s"] / result["later_resume_median_s"]
    print(f"first resume (median of {args.runs} runs) {result['first_resume_s'] * 1e3:.1f} ms, later resumes "
          f"(median of {len(later)}) {result['later_resume_median_s'] * 1e3:.1f} ms: ratio {result['ratio']:.2f} "
          f"(bound {RATIO_BOUND})")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "first_resume.json").write_text(json.dumps(result, indent=2))
    _plot(result, args.out / "first_resume.png")
    return result


def _run(args: argparse.Namespace, model: Path, tmp: Path) -> dict[str, Any]:
    import ray

    from kvres.actors.engines.llama.engine import LlamaModel
    from kvres.cluster import BackendConfig, ColdStoreConfig, KvresConfig, connect

    if ray.is_initialized():
        raise RuntimeError("benchmarks.first_resume needs a fresh local Ray cluster: ray is already initialised")
    probe_cache = tmp / "probe-cache"  # fresh: nothing measured on this machine yet
    os.environ["KVRES_CACHE_DIR"] = str(probe_cache)
    vocab = LlamaModel(model).n_vocab
    n_ctx = args.tokens + 64 + (args.tokens % 2)
    config = KvresConfig(
        backends=[BackendConfig(name="bench", model_path=model, n_ctx=n_ctx, n_seq_max=2, kv_budget_tokens=n_ctx,
                                n_threads=args.threads)],
        cold_store=ColdStoreConfig(ram_budget_bytes=512 << 20, disk_budget_bytes=512 << 20, disk_dir=tmp / "cold"),
    )
    manager = connect(namespace=f"kvres-bench-{uuid.uuid4().hex[:6]}", config=config, include_dashboard=False,
                      num_cpus=2, runtime_env={"env_vars": {"KVRES_CACHE_DIR": str(probe_cache)}})
    up = time.perf_counter()
    try:
        tokens = [int(t) for t in np.random.default_rng(0).integers(3, vocab, size=args.tokens)]
        rows = resume_cycles(manager, tokens, args.resumes)
        rows["probe_state"], rows["probe_wait_s"] = _wait_for_probe(manager)
        rows["probe_done_after_start_s"] = time.perf_counter() - up  # the cluster was up: the backend started
    finally:
        manager.shutdown()
        ray.shutdown()
        os.environ.pop("KVRES_CACHE_DIR", None)
    return rows


def _plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = result["runs"]
    width = 0.8 / len(runs)
    fig, ax = plt.subplots(figsize=(8, 4))
    for i, run in enumerate(runs):
        x = np.arange(1, len(run["resume_s"]) + 1) + (i - (len(runs) - 1) / 2) * width
        ax.bar(x, [t * 1e3 for t in run["resume_s"]], width, label=f"run {i + 1}")
    ax.axhline(result["later_resume_median_s"] * 1e3, color="black", linestyle=":", label="later median")
    ax.axhline(result["later_resume_median_s"] * 1e3 * RATIO_BOUND, color="tab:red", linestyle="--",
               label=f"{RATIO_BOUND:.0f}x the later median")
    ax.set_xlabel("resume (1 = the first, on a fresh probe cache)")
    ax.set_ylabel("ms")
    ax.set_title(f"{result['tokens']}-token session: first (median) / later median = {result['ratio']:.2f}")
    ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


if __name__ == "__main__":
    main()
