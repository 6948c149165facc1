"""Summaries and outputs of a passkey run: JSON, markdown tables, one PNG.

Primitives:
- ``COLUMNS``: the (engine, method) pairs shown, in order.
- ``summarize(records, depth_budget) -> dict``: accuracy and count per (engine, family, method,
  budget) over all depths, per depth at ``depth_budget``, and per (budget, depth).
- ``markdown(summary, cost, meta) -> str``: per task family an accuracy-vs-budget and an
  accuracy-vs-depth table (``-`` where a method cannot run at that budget), then the scoring cost.
- ``plot(summary, cost, families, path)``: a PNG, matplotlib Agg: per family accuracy vs budget and
  vs depth, then the scoring cost per engine.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from .cost import COST_METHODS
from .harness import Record
from .sessions import GENAI, LLAMA, METHODS, OPENVINO

ENGINE_LABEL = {LLAMA: "llama", OPENVINO: "ov", GENAI: "genai"}
COLUMNS = tuple((e, m) for e in (LLAMA, OPENVINO, GENAI) for m in METHODS[e])
FAMILY_TITLE = {1: "family 1: one passkey among filler", 2: "family 2: several key/value needles"}
COLORS = {"full": "black", "streaming": "tab:red", "h2o": "tab:orange", "keynorm": "tab:brown",
          "snapkv": "tab:blue", "snapkv-3x": "tab:cyan", "genai": "tab:green"}
STYLES = {LLAMA: "-o", OPENVINO: "--s", GENAI: ":^"}


def _key(x: float) -> str:
    return f"{x:.3f}"


def summarize(records: Iterable[Record], depth_budget: float) -> dict[str, Any]:
    by_budget: dict[tuple[str, int, str, str], list[bool]] = defaultdict(list)
    by_depth: dict[tuple[str, int, str, str], list[bool]] = defaultdict(list)
    by_cell: dict[tuple[str, int, str, str], list[bool]] = defaultdict(list)
    for r in records:
        by_budget[(r.engine, r.family, r.method, _key(r.budget))].append(r.correct)
        by_cell[(r.engine, r.family, r.method, f"{_key(r.budget)}@{_key(r.depth)}")].append(r.correct)
        if r.method == "full" or abs(r.budget - depth_budget) < 1e-9:
            by_depth[(r.engine, r.family, r.method, _key(r.depth))].append(r.correct)

    def nest(table: dict[tuple[str, int, str, str], list[bool]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for (engine, family, method, x), hits in sorted(table.items()):
            slot = out.setdefault(engine, {}).setdefault(str(family), {}).setdefault(method, {})
            slot[x] = {"accuracy": sum(hits) / len(hits), "n": len(hits)}
        return out

    return {"depth_budget": depth_budget, "by_budget": nest(by_budget), "by_depth": nest(by_depth),
            "by_budget_and_depth": nest(by_cell)}


def _cell(table: dict[str, Any], engine: str, family: int, method: str, x: str) -> str:
    hit = table.get(engine, {}).get(str(family), {}).get(method, {}).get(x)
    return "-" if hit is None else f"{100 * hit['accuracy']:.0f}"


def _columns(summary: dict[str, Any]) -> list[tuple[str, str]]:
    return [(e, m) for e, m in COLUMNS if e in summary["by_budget"]]


def markdown(summary: dict[str, Any], cost: dict[str, Any], meta: dict[str, Any]) -> str:
    columns = _columns(summary)
    head = "| " + " | ".join(f"{ENGINE_LABEL[e]} {m}" for e, m in columns) + " |"
    rule = "|---" * (len(columns) + 1) + "|"
    lines = [
        "# Passkey retrieval under eviction (exact-match accuracy, %)",
        "",
        f"Model `{meta['model']}`; prompts of {meta['n_tokens']} tokens; {meta['per_cell']} prompts per "
        f"(family, depth); depths {meta['depths']}; kvres.cluster sessions (open, append the prompt, "
        f"generate the answer, close); blocks of {meta['block_size']} tokens, sinks {meta['sink_tokens']}, "
        f"recent window = question + {meta['recent_extra']}, SnapKV window = the question; re-based after "
        f"eviction: {', '.join(meta['rebase']) or 'none'} (the others keep position gaps). `full` is the "
        "full cache (budget 100%). genai's own eviction runs where its cache (whole 32-token blocks, at "
        "least 96 tokens) fits in the budget.",
        "",
    ]
    for family in meta["families"]:
        budgets = sorted({x for e in summary["by_budget"].values() for m in e.get(str(family), {}).values()
                          for x in m}, key=float)
        lines += [f"## {FAMILY_TITLE[family]}", "", "Accuracy vs resident budget (all depths):", "",
                  "| budget " + head, rule]
        for x in budgets:
            if float(x) == 1.0:
                continue
            cells = [_cell(summary["by_budget"], e, family, m, x if m != "full" else _key(1.0)) for e, m in columns]
            lines.append(f"| {100 * float(x):.0f}% | " + " | ".join(cells) + " |")
        depths = sorted({x for e in summary["by_depth"].values() for m in e.get(str(family), {}).values()
                         for x in m}, key=float)
        lines += ["", f"Accuracy vs needle depth at a {100 * summary['depth_budget']:.0f}% budget:", "",
                  "| depth " + head, rule]
        for x in depths:
            cells = [_cell(summary["by_depth"], e, family, m, x) for e, m in columns]
            lines.append(f"| {100 * float(x):.0f}% | " + " | ".join(cells) + " |")
        lines.append("")
    if cost:
        any_cost = next(iter(cost.values()))
        lines += [
            "## Scoring cost",
            "",
            f"A {any_cost['prompt_tokens']}-token prompt at a {100 * any_cost['budget']:.0f}% budget, then "
            f"generate({any_cost['generate_tokens']}); medians of {any_cost['repeats']} runs, as ratios to "
            "streaming's in the same run (seconds in brackets):",
            "",
            "| engine | " + " | ".join(f"{m} append | {m} generate" for m in COST_METHODS) + " |",
            "|---" * (2 * len(COST_METHODS) + 1) + "|",
        ]
        for engine, c in cost.items():
            cells = []
            for m in COST_METHODS:
                row = c["methods"][m]
                cells += [f"{row['append_ratio']:.2f} ({row['append_s']:.3f})",
                          f"{row['generate_ratio']:.2f} ({row['generate_s']:.2f})"]
            lines.append(f"| {ENGINE_LABEL[engine]} | " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines)


def plot(summary: dict[str, Any], cost: dict[str, Any], families: list[int], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    columns = _columns(summary)
    rows = len(families) + (1 if cost else 0)
    fig, axes = plt.subplots(rows, 2, figsize=(12, 4.2 * rows), squeeze=False)
    for row, family in zip(axes, families, strict=False):
        for ax, table, xlabel in ((row[0], "by_budget", "resident budget (% of prompt)"),
                                  (row[1], "by_depth", "needle depth (% of filler)")):
            for engine, method in columns:
                slot = summary[table].get(engine, {}).get(str(family), {}).get(method)
                if not slot:
                    continue
                xs = sorted(slot, key=float)
                ys = [100 * slot[x]["accuracy"] for x in xs]
                label = f"{ENGINE_LABEL[engine]} {method}"
                if table == "by_budget" and method == "full":
                    ax.axhline(ys[0], color=COLORS[method], ls=STYLES[engine][:-1], lw=1, label=label)
                    continue
                ax.plot([100 * float(x) for x in xs], ys, STYLES[engine], color=COLORS[method], ms=4, label=label)
            title = "vs budget" if table == "by_budget" else f"vs depth at {100 * summary['depth_budget']:.0f}% budget"
            ax.set_title(f"{FAMILY_TITLE[family]}: {title}", fontsize=9)
            ax.set_xlabel(xlabel)
            ax.set_ylabel("exact match (%)")
            ax.set_ylim(-3, 103)
            ax.grid(True, alpha=0.3)
    if cost:
        width = 0.8 / max(1, len(cost))
        for ax, what in zip(axes[-1], ("append", "generate"), strict=True):
            for i, (engine, c) in enumerate(cost.items()):
                ratios = [c["methods"][m][f"{what}_ratio"] for m in COST_METHODS]
                ax.bar([j + i * width for j in range(len(COST_METHODS))], ratios, width,
                       label=ENGINE_LABEL[engine], color=("tab:blue", "tab:orange", "tab:green")[i % 3])
            ax.axhline(1.0, color="black", lw=0.8)
            ax.set_xticks([j + width * (len(cost) - 1) / 2 for j in range(len(COST_METHODS))], list(COST_METHODS))
            any_cost = next(iter(cost.values()))
            tokens = f"generate({any_cost['generate_tokens']})" if what == "generate" else "append (prefill + compress)"
            ax.set_title(f"scoring cost: {tokens} time / streaming's", fontsize=9)
            ax.set_ylabel("ratio to streaming")
            ax.legend(fontsize=8)
            ax.grid(True, axis="y", alpha=0.3)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=6, fontsize=7, frameon=False)
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)
