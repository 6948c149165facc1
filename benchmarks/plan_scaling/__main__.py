"""Plan time of ``plan_hot_set`` from 100 to 1,000,000 blocks, and its fitted growth exponent.

Run: ``.venv/bin/python -m benchmarks.plan_scaling [--out DIR] [--max-blocks N]``
Writes ``plan_scaling.json`` and ``plan_scaling.png`` into ``DIR`` (default benchmarks/results).
Each size is planned with streaming + scores (the heaviest path), from a ``BlockTable`` (the
columnar input the cluster layer uses) and from a list of ``Block`` objects (which adds one Python
attribute read per field and block); the median of several runs is reported. The growth exponent
is the slope of log(time) against log(blocks), fitted on the table path.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from kvres.policy import Capabilities, PlanInput, Range, StreamPolicy, plan_hot_set
from kvres.policy.blocks import BlockTable

CAPS = Capabilities(remove_middle=True, position_shift=True)
BLOCK = 16


def time_plan(n: int, repeats: int, as_objects: bool) -> float:
    table = BlockTable.uniform(Range(0, n * BLOCK), BLOCK)
    blocks = table.to_blocks() if as_objects else table
    scores = np.random.default_rng(n).random(n)
    budget = n * BLOCK // 4
    inp = PlanInput(blocks, budget, StreamPolicy(True, 4, min(1024, budget // 2)), CAPS, scores)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        plan = plan_hot_set(inp)
        times.append(time.perf_counter() - t0)
    assert plan.hot_tokens <= inp.budget_tokens
    return float(np.median(times))


def main(argv: list[str] | None = None) -> dict[str, object]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    parser.add_argument("--max-blocks", type=int, default=1_000_000)
    args = parser.parse_args(argv)
    sizes = [n for n in (100, 1_000, 10_000, 62_500, 100_000, 1_000_000) if n <= args.max_blocks]
    rows = []
    for n in sizes:
        repeats = 3 if n >= 100_000 else 7
        seconds = time_plan(n, repeats, as_objects=False)
        object_seconds = time_plan(n, repeats, as_objects=True)
        rows.append({"blocks": n, "tokens": n * BLOCK, "plan_ms": seconds * 1e3,
                     "plan_ms_from_objects": object_seconds * 1e3})
        print(f"{n:>9} blocks  {seconds * 1e3:9.2f} ms (table)  {object_seconds * 1e3:9.2f} ms (objects)")
    big = [r for r in rows if r["blocks"] >= 1_000]
    slope = float(np.polyfit(np.log([r["blocks"] for r in big]), np.log([r["plan_ms"] for r in big]), 1)[0])
    result = {"rows": rows, "growth_exponent": slope, "block_size": BLOCK}
    print(f"growth exponent {slope:.2f}")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "plan_scaling.json").write_text(json.dumps(result, indent=2))
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    ax.loglog([r["blocks"] for r in rows], [r["plan_ms"] for r in rows], "o-", label="BlockTable")
    ax.loglog([r["blocks"] for r in rows], [r["plan_ms_from_objects"] for r in rows], "s--",
              label="list of Block")
    ax.legend()
    ax.set_xlabel("blocks (16 tokens each)")
    ax.set_ylabel("plan time (ms, median)")
    ax.set_title(f"plan_hot_set scaling, exponent {slope:.2f}")
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(args.out / "plan_scaling.png", dpi=100)
    return result


if __name__ == "__main__":
    main()
