"""What a chat-fleet run reports: each side over its repeats, the two sides set side by side, a PNG.

Primitives:
- ``pooled(runs) -> dict``: one side over its repeats: turns/s over their summed wall time, TTFT
  and turn latency p50 / p99 over every timed turn of every repeat, CPU seconds per turn (the
  whole process tree, and by process), each repeat's turns/s, TTFT p50 and CPU per turn kept.
- ``compare(sides, pooled_rows) -> dict``: kvres over llama-server: turns/s, TTFT p50, turn p50 and
  CPU seconds per turn, pooled and as the median of the repeats' paired ratios (the two sides of
  one repeat ran back to back).
- ``plot(result, path)``: turns/s, TTFT and turn p50 / p99, CPU seconds per turn by process.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

import numpy as np


def _pct(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values, dtype=np.float64), q)) if values else float("nan")


def pooled(runs: list[dict[str, Any]]) -> dict[str, Any]:
    ttft = [t for r in runs for t in r["ttft_samples_s"]]
    latency = [t for r in runs for t in r["latency_samples_s"]]
    turns = sum(r["turns"] for r in runs)
    labels = sorted({name for r in runs for name in r["cpu_by_process"]})
    return {
        "side": runs[0]["side"], "repeats": len(runs), "turns": turns, "wall_s": sum(r["wall_s"] for r in runs),
        "failed_turns": sum(r["failed_turns"] for r in runs),
        "turns_per_s": turns / sum(r["wall_s"] for r in runs),
        "ttft_p50_ms": _pct(ttft, 50) * 1e3, "ttft_p99_ms": _pct(ttft, 99) * 1e3,
        "latency_p50_ms": _pct(latency, 50) * 1e3, "latency_p99_ms": _pct(latency, 99) * 1e3,
        "cpu_s_per_turn": sum(r["cpu_s"] for r in runs) / max(1, turns),
        "cpu_by_process": {name: {
            "cpu_s_per_turn": sum(r["cpu_by_process"].get(name, {}).get("cpu_s_per_turn", 0.0) * r["turns"]
                                  for r in runs) / max(1, turns),
            "processes": max(r["cpu_by_process"].get(name, {}).get("processes", 0) for r in runs)}
            for name in labels},
        "prompt_tokens_per_turn": sum(r["prompt_tokens"] for r in runs) / max(1, turns),
        "prefilled_tokens_per_turn": sum(r["prefilled_tokens"] for r in runs) / max(1, turns),
        "runs_turns_per_s": [r["turns_per_s"] for r in runs],
        "runs_ttft_p50_ms": [r["ttft_p50_ms"] for r in runs],
        "runs_cpu_s_per_turn": [r["cpu_s_per_turn"] for r in runs],
    }


def compare(runs: dict[str, list[dict[str, Any]]], rows: dict[str, dict[str, Any]],
            mine: str = "kvres", peer: str = "llama-server") -> dict[str, Any]:
    if mine not in rows or peer not in rows:
        return {}
    a, b = rows[mine], rows[peer]

    def paired(key: str) -> float:
        return float(statistics.median(x[key] / y[key] for x, y in zip(runs[mine], runs[peer], strict=True)))

    return {
        f"{mine}_over_{peer}": {
            "turns_per_s": a["turns_per_s"] / b["turns_per_s"],
            "ttft_p50": a["ttft_p50_ms"] / b["ttft_p50_ms"],
            "latency_p50": a["latency_p50_ms"] / b["latency_p50_ms"],
            "cpu_s_per_turn": a["cpu_s_per_turn"] / b["cpu_s_per_turn"],
        },
        f"{mine}_over_{peer}_paired_median": {
            "turns_per_s": paired("turns_per_s"), "ttft_p50": paired("ttft_p50_ms"),
            "latency_p50": paired("latency_p50_ms"), "cpu_s_per_turn": paired("cpu_s_per_turn"),
        },
    }


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["sides"]
    names = list(rows)
    x = np.arange(len(names))
    fig, (ax1, ax2, ax3) = plt.subplots(1, 3, figsize=(18, 4.8))
    ax1.bar(x, [rows[n]["turns_per_s"] for n in names], color="tab:blue")
    ax1.set_xticks(x, names)
    ax1.set_ylabel("turns/s")
    w = result["workload"]
    ax1.set_title(f"{result['config']}: {w['conversations']} conversations over {w['slots']} slots, "
                  f"{w['clients']} clients", fontsize="medium")
    for i, (key, label) in enumerate((("ttft_p50_ms", "TTFT p50"), ("ttft_p99_ms", "TTFT p99"),
                                      ("latency_p50_ms", "turn p50"), ("latency_p99_ms", "turn p99"))):
        ax2.bar(x + (i - 1.5) * 0.2, [rows[n][key] for n in names], 0.2, label=label)
    ax2.set_xticks(x, names)
    ax2.set_ylabel("ms")
    ax2.set_yscale("log")
    ax2.legend(fontsize="small")
    bottom = np.zeros(len(names))
    labels = sorted({p for n in names for p in rows[n]["cpu_by_process"]},
                    key=lambda p: -max(rows[n]["cpu_by_process"].get(p, {}).get("cpu_s_per_turn", 0.0) for n in names))
    colors = plt.get_cmap("tab20")
    for i, p in enumerate(labels):
        heights = np.array([rows[n]["cpu_by_process"].get(p, {}).get("cpu_s_per_turn", 0.0) for n in names])
        ax3.bar(x, heights * 1e3, bottom=bottom * 1e3, label=p, color=colors(i % 20))
        bottom += heights
    ax3.set_xticks(x, names)
    ax3.set_ylabel("CPU ms per turn (every process of the side)")
    ax3.legend(fontsize="x-small", loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
