"""Summaries and outputs of a passkey run: JSON, markdown tables, one PNG.

Primitives:
- ``COLUMNS``: the (engine, method) pairs shown, in order.
- ``summarize(records, depth_budget) -> dict``: accuracy and count per (engine, family, method,
  budget) over all depths, and per depth at ``depth_budget``.
- ``markdown(summary, meta) -> str``: one accuracy-vs-budget and one accuracy-vs-depth table per
  task family (``-`` where a method cannot run at that budget).
- ``plot(summary, path)``: a 2x2 PNG (rows: families; columns: vs budget, vs depth), matplotlib Agg.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from .harness import Record

ENGINE_LABEL = {"llama.cpp": "llama", "openvino": "ov", "openvino-genai": "genai"}
COLUMNS = (
    ("llama.cpp", "full"), ("llama.cpp", "streaming"), ("llama.cpp", "h2o"), ("llama.cpp", "h2o_norm"),
    ("llama.cpp", "snapkv"),
    ("openvino", "full"), ("openvino", "streaming"), ("openvino", "h2o"), ("openvino", "h2o_norm"),
    ("openvino", "snapkv"),
    ("openvino-genai", "full"), ("openvino-genai", "native_sum"), ("openvino-genai", "native_norm_sum"),
)
FAMILY_TITLE = {1: "family 1: one passkey among filler", 2: "family 2: several key/value needles"}


def _key(x: float) -> str:
    return f"{x:.3f}"


def summarize(records: Iterable[Record], depth_budget: float) -> dict[str, Any]:
    by_budget: dict[tuple[str, int, str, str], list[bool]] = defaultdict(list)
    by_depth: dict[tuple[str, int, str, str], list[bool]] = defaultdict(list)
    for r in records:
        by_budget[(r.engine, r.family, r.method, _key(r.budget))].append(r.correct)
        if r.method == "full" or abs(r.budget - depth_budget) < 1e-9:
            by_depth[(r.engine, r.family, r.method, _key(r.depth))].append(r.correct)

    def nest(table: dict[tuple[str, int, str, str], list[bool]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for (engine, family, method, x), hits in sorted(table.items()):
            slot = out.setdefault(engine, {}).setdefault(str(family), {}).setdefault(method, {})
            slot[x] = {"accuracy": sum(hits) / len(hits), "n": len(hits)}
        return out

    return {"depth_budget": depth_budget, "by_budget": nest(by_budget), "by_depth": nest(by_depth)}


def _cell(table: dict[str, Any], engine: str, family: int, method: str, x: str) -> str:
    hit = table.get(engine, {}).get(str(family), {}).get(method, {}).get(x)
    return "-" if hit is None else f"{100 * hit['accuracy']:.0f}"


def markdown(summary: dict[str, Any], meta: dict[str, Any]) -> str:
    head = "| " + " | ".join(f"{ENGINE_LABEL[e]} {m}" for e, m in COLUMNS) + " |"
    rule = "|---" * (len(COLUMNS) + 1) + "|"
    lines = [
        "# Passkey retrieval under eviction (exact-match accuracy, %)",
        "",
        f"Model `{meta['model']}`; prompts of {meta['n_tokens']} tokens; {meta['per_cell']} prompts per "
        f"(family, depth); depths {meta['depths']}; strict protocol (last prompt token re-decoded after "
        f"eviction); blocks of {meta['block_size']} tokens, sinks {meta['sink_tokens']}, recent window = "
        f"question + {meta['recent_extra']}; re-based after eviction: {', '.join(meta['rebase']) or 'none'} (the others keep position gaps). `full` is the full cache (budget 100%). genai's native "
        "eviction runs only where its 32-token blocks allow (max_cache_size >= 96, rounded up to 32).",
        "",
    ]
    for family in meta["families"]:
        budgets = sorted({x for e in summary["by_budget"].values() for m in e.get(str(family), {}).values()
                          for x in m})
        lines += [f"## {FAMILY_TITLE[family]}", "", "Accuracy vs resident budget (all depths):", "",
                  "| budget " + head, rule]
        for x in budgets:
            cells = [_cell(summary["by_budget"], e, family, m, x if m != "full" else _key(1.0))
                     for e, m in COLUMNS]
            lines.append(f"| {100 * float(x):.0f}% | " + " | ".join(cells) + " |")
        depths = sorted({x for e in summary["by_depth"].values() for m in e.get(str(family), {}).values()
                         for x in m})
        lines += ["", f"Accuracy vs needle depth at a {100 * summary['depth_budget']:.0f}% budget:", "",
                  "| depth " + head, rule]
        for x in depths:
            cells = [_cell(summary["by_depth"], e, family, m, x) for e, m in COLUMNS]
            lines.append(f"| {100 * float(x):.0f}% | " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines)


def plot(summary: dict[str, Any], families: list[int], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = {"full": "black", "streaming": "tab:red", "h2o": "tab:orange", "h2o_norm": "tab:brown", "snapkv": "tab:blue",
              "native_sum": "tab:green", "native_norm_sum": "tab:purple"}
    styles = {"llama.cpp": "-o", "openvino": "--s", "openvino-genai": ":^"}
    fig, axes = plt.subplots(len(families), 2, figsize=(12, 4.2 * len(families)), squeeze=False)
    for row, family in zip(axes, families, strict=True):
        for ax, table, xlabel in ((row[0], "by_budget", "resident budget (% of prompt)"),
                                  (row[1], "by_depth", "needle depth (% of filler)")):
            for engine, method in COLUMNS:
                slot = summary[table].get(engine, {}).get(str(family), {}).get(method)
                if not slot:
                    continue
                xs = sorted(slot, key=float)
                ys = [100 * slot[x]["accuracy"] for x in xs]
                if table == "by_budget" and method == "full":
                    ax.axhline(ys[0], color=colors[method], ls=styles[engine][:-1], lw=1,
                               label=f"{ENGINE_LABEL[engine]} {method}")
                    continue
                ax.plot([100 * float(x) for x in xs], ys, styles[engine], color=colors[method], ms=4,
                        label=f"{ENGINE_LABEL[engine]} {method}")
            title = "vs budget" if table == "by_budget" else f"vs depth at {100 * summary['depth_budget']:.0f}% budget"
            ax.set_title(f"{FAMILY_TITLE[family]}: {title}", fontsize=9)
            ax.set_xlabel(xlabel)
            ax.set_ylabel("exact match (%)")
            ax.set_ylim(-3, 103)
            ax.grid(True, alpha=0.3)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=7, fontsize=7, frameon=False)
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)
