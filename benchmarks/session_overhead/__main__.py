"""``generate(256)`` through the Ray API vs the same LlamaExecutor in-process, as a ratio.

Run: ``.venv/bin/python -m benchmarks.session_overhead [--model PATH] [--repeats N] [--out DIR]``
Writes ``session_overhead.json`` (and a PNG) into DIR (default benchmarks/results). Both sides
start from the same 200-token prompt, decode 256 tokens greedily without stopping at
end-of-generation, on one engine thread; the runs alternate so machine noise hits both alike.
The ratio is median(Ray) / median(in-process); the acceptance bound is 1.15.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import uuid
from pathlib import Path

PROMPT = list(range(3, 203))
TOKENS = 256


def main(argv: list[str] | None = None) -> dict[str, object]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=str(Path(__file__).resolve().parents[3] / "shared/models/stories260K.gguf"))
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    args = parser.parse_args(argv)

    import ray

    from kvres.actors.engines.llama import LlamaExecutor
    from kvres.cluster import BackendConfig, KvresConfig, connect

    executor = LlamaExecutor(args.model, n_ctx=2048, n_seq_max=2, n_threads=1)
    config = KvresConfig(backends=[BackendConfig(name="bench", model_path=args.model, n_ctx=2048,
                                                 n_seq_max=2, kv_budget_tokens=2000, n_threads=1)])
    manager = connect(namespace=f"kvres-bench-{uuid.uuid4().hex[:6]}", config=config,
                      include_dashboard=False, num_cpus=2)
    local, remote = [], []
    try:
        for i in range(args.repeats + 1):  # the first round warms both up and is dropped
            sid = f"local-{i}"
            executor.open_session(sid)
            executor.append(sid, PROMPT)
            t0 = time.perf_counter()
            out_local = executor.generate(sid, TOKENS, stop_at_eog=False)
            t_local = time.perf_counter() - t0
            executor.close_session(sid)

            session = manager.open_session(backend="bench")
            session.append(PROMPT)
            t0 = time.perf_counter()
            out_remote = session.generate(TOKENS)
            t_remote = time.perf_counter() - t0
            session.close()
            assert out_local == out_remote, "both sides must decode the same tokens"
            if i:
                local.append(t_local)
                remote.append(t_remote)
    finally:
        manager.shutdown()
        ray.shutdown()
    ratio = statistics.median(remote) / statistics.median(local)
    result = {
        "tokens": TOKENS, "repeats": args.repeats,
        "in_process_s": local, "ray_s": remote,
        "in_process_median_s": statistics.median(local), "ray_median_s": statistics.median(remote),
        "ratio": ratio, "bound": 1.15,
    }
    print(f"in-process {statistics.median(local) * 1e3:.1f} ms, Ray {statistics.median(remote) * 1e3:.1f} ms, "
          f"ratio {ratio:.3f} (bound 1.15)")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "session_overhead.json").write_text(json.dumps(result, indent=2))
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 4))
    ax.boxplot([[t * 1e3 for t in local], [t * 1e3 for t in remote]])
    ax.set_xticks([1, 2], ["in-process", "Ray API"])
    ax.set_ylabel(f"generate({TOKENS}) time (ms)")
    ax.set_title(f"session overhead ratio {ratio:.3f}")
    fig.tight_layout()
    fig.savefig(args.out / "session_overhead.png", dpi=100)
    return result


if __name__ == "__main__":
    main()
