"""The table of a tier-cells run: rows per cell, the auto row against the cell it chose, one PNG.

Primitives:
- ``summarize(results, baseline) -> list[dict]``: per cell its KV types, resident budget, decode
  tokens/s and the ratio to ``baseline``'s (measured in the same run), accuracy per needle family,
  recall counters; the auto row also names the cell it chose and how its numbers compare with it
  (same answer on every prompt, decode ratio).
- ``markdown(rows, meta) -> str``; ``plot(rows, path)``: accuracy per family and decode tokens/s
  per cell (matplotlib, Agg).
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from .cells import AUTO, Cell, chosen_cell


def summarize(results: list[dict[str, Any]], baseline: str, table: list[Cell]) -> list[dict[str, Any]]:
    by_name = {r["cell"]: r for r in results}
    base_rate = by_name[baseline]["decode"]["tokens_per_s"]
    rows: list[dict[str, Any]] = []
    for r in results:
        answers = r["answers"]
        row: dict[str, Any] = {
            "cell": r["cell"], "kv_types": "/".join(r["kv_types"]), "kv_budget_tokens": r["kv_budget_tokens"],
            "session_policy": r["session_policy"]["kind"],
            "decode_tokens_per_s": r["decode"]["tokens_per_s"],
            "decode_ratio": r["decode"]["tokens_per_s"] / base_rate,
            "accuracy": r["accuracy"],
            "recalled_tokens_per_prompt": statistics.mean(a["recalled_tokens"] for a in answers),
            "recall_ms_per_prompt": statistics.mean(a["recall_us"] for a in answers) / 1e3,
            "peak_resident_tokens": max(a["peak_resident_tokens"] for a in answers),
        }
        if r["cell"] == AUTO:
            chosen = chosen_cell(r["tier_decision"], r["kv_budget_tokens"], table)
            row["chose"] = chosen
            twin = by_name.get(chosen)
            if twin is not None:
                same = [a["answer"] == b["answer"] for a, b in zip(answers, twin["answers"], strict=True)]
                row["same_answers_as_chosen"] = sum(same) / len(same)
                row["decode_ratio_to_chosen"] = r["decode"]["tokens_per_s"] / twin["decode"]["tokens_per_s"]
        rows.append(row)
    return rows


def markdown(rows: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    families = sorted({f for r in rows for f in r["accuracy"]})
    head = ["cell", "KV types", "resident budget (tokens)", "session policy", "decode tok/s", "vs f16 resident",
            *[f"passkey family {f} (%)" for f in families], "recalled tokens / prompt", "recall ms / prompt"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        name = r["cell"] + (f" (chose {r['chose']})" if "chose" in r else "")
        cols = [name, r["kv_types"], str(r["kv_budget_tokens"]), r["session_policy"],
                f"{r['decode_tokens_per_s']:.0f}", f"{r['decode_ratio']:.2f}",
                *[f"{100 * r['accuracy'][f]:.0f}" for f in families],
                f"{r['recalled_tokens_per_prompt']:.0f}", f"{r['recall_ms_per_prompt']:.1f}"]
        lines.append("| " + " | ".join(cols) + " |")
    auto = next((r for r in rows if "chose" in r), None)
    if auto is not None and "same_answers_as_chosen" in auto:
        lines.append("")
        lines.append(f"auto chose **{auto['chose']}**: the same answer on {100 * auto['same_answers_as_chosen']:.0f}% "
                     f"of the prompts, decode {auto['decode_ratio_to_chosen']:.2f}x that cell's.")
    lines.append("")
    lines.append(f"{meta['prompts_per_family']} two-turn prompts per family of {meta['n_tokens']} tokens, needle "
                 f"depth {meta['depth'][0]:.2f}-{meta['depth'][1]:.2f}; n_ctx {meta['n_ctx']}; decode: "
                 f"generate({meta['decode_tokens']}) after a {meta['n_tokens']}-token prompt, best of "
                 f"{meta['decode_repeats']}.")
    return "\n".join(lines) + "\n"


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [r["cell"] + (f"\n(chose {r['chose']})" if "chose" in r else "") for r in rows]
    families = sorted({f for r in rows for f in r["accuracy"]})
    fig, (acc_ax, rate_ax) = plt.subplots(1, 2, figsize=(12, 4.5))
    width = 0.8 / len(families)
    for j, family in enumerate(families):
        xs = [i + (j - (len(families) - 1) / 2) * width for i in range(len(rows))]
        acc_ax.bar(xs, [100 * r["accuracy"][family] for r in rows], width, label=f"family {family}")
    acc_ax.set_xticks(range(len(rows)), names, fontsize=8)
    acc_ax.set_ylabel("two-turn passkey accuracy (%)")
    acc_ax.set_ylim(0, 105)
    acc_ax.legend(loc="lower left")
    acc_ax.set_title("retrieval per cell")
    bars = rate_ax.bar(range(len(rows)), [r["decode_tokens_per_s"] for r in rows], color="tab:gray")
    for bar, r in zip(bars, rows, strict=True):
        rate_ax.annotate(f"{r['decode_ratio']:.2f}x", (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                         ha="center", va="bottom", fontsize=8)
    rate_ax.set_xticks(range(len(rows)), names, fontsize=8)
    rate_ax.set_ylabel("decode tokens/s (ratio to f16 resident)")
    rate_ax.set_title("decode speed per cell")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
