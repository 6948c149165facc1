"""The four PASS checks of the T* table (docs/policies.md, "T*: automatic KV tier choice"), per cell.

Primitives:
- ``CHECKS``: the four, in order:
  1. ``retrieval``: the cell answers the needle as often as f16 resident, per family (at most
     ``RETRIEVAL_SLACK`` of the prompts fewer: a cheaper tier must not cost answers);
  2. ``residency``: the cell holds what its tier says: a resident tier never spills nor recalls and
     keeps every prompt token; a spilling tier spills, and its sessions never hold more than the
     resident budget T* gave it;
  3. ``decode_cost``: a spilling tier decodes no slower than T* predicted for its spill (measured
     drop vs f16 resident <= ``predicted_drop`` + ``DECODE_NOISE``); a resident tier is n/a (T*
     predicts no drop for it);
  4. ``auto_choice``: auto gives the answers of the cell it chose on every prompt and decodes
     within ``DECODE_NOISE`` of that cell.
- ``Check(check, cell, status, detail)``: ``status`` "PASS", "FAIL" or "n/a".
- ``evaluate(results, rows, baseline) -> list[Check]``: every check for every cell of a run;
  ``deterministic(check)``: whether a check reads only answers and counters (what a test can
  assert on any machine), not wall-clock time.
- ``checks_markdown(checks) -> str``: the cells x checks table.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from .cells import AUTO

CHECKS = ("retrieval", "residency", "decode_cost", "auto_choice")
RETRIEVAL_SLACK = 0.05  # of the prompts of a family: a cell may miss this many more than f16 resident
DECODE_NOISE = 0.15  # decode speeds of one configuration vary by about 10% between runs on a shared host


@dataclass(frozen=True)
class Check:
    check: str
    cell: str
    status: str
    detail: str

    def as_dict(self) -> dict[str, str]:
        return asdict(self)


def deterministic(check: str) -> bool:
    return check in ("retrieval", "residency")


def _retrieval(result: dict[str, Any], base: dict[str, Any]) -> Check:
    misses = []
    for family, base_acc in base["accuracy"].items():
        n = sum(1 for a in result["answers"] if str(a["family"]) == family)
        slack = math.floor(RETRIEVAL_SLACK * n) / n if n else 0.0
        acc = result["accuracy"][family]
        if acc + slack + 1e-9 < base_acc:
            misses.append(f"family {family} {100 * acc:.0f}% < {100 * base_acc:.0f}%")
    detail = "; ".join(misses) or "as f16 resident on every family"
    return Check("retrieval", result["cell"], "FAIL" if misses else "PASS", detail)


def _spills(result: dict[str, Any]) -> bool:
    decision = result["tier_decision"]
    return decision is not None and decision["chosen_spill_bytes"] > 0


def _residency(result: dict[str, Any]) -> Check:
    answers = result["answers"]
    budget = result["kv_budget_tokens"]
    if _spills(result):
        spilled = sum(a["spilled_bytes"] for a in answers)
        peak = max(a["peak_resident_tokens"] for a in answers)
        ok = spilled > 0 and peak <= budget
        return Check("residency", result["cell"], "PASS" if ok else "FAIL",
                     f"spills ({spilled} bytes), peak {peak} of a {budget}-token resident budget")
    spilled = sum(a["spilled_bytes"] + a["recalled_tokens"] for a in answers)
    short = [a for a in answers if a["resident_tokens"] < a["n_tokens"]]
    ok = spilled == 0 and not short
    return Check("residency", result["cell"], "PASS" if ok else "FAIL",
                 "resident: every prompt token kept, nothing spilled" if ok else
                 f"resident tier spilled {spilled} or kept fewer tokens than its prompt on {len(short)} prompts")


def _decode_cost(result: dict[str, Any], row: dict[str, Any]) -> Check:
    if not _spills(result):
        return Check("decode_cost", result["cell"], "n/a", "resident tier: T* predicts no drop")
    predicted = float(result["tier_decision"]["predicted_drop"])
    measured = 1.0 - float(row["decode_ratio"])
    ok = measured <= predicted + DECODE_NOISE
    return Check("decode_cost", result["cell"], "PASS" if ok else "FAIL",
                 f"decode drop {measured:+.2f} vs T*'s predicted {predicted:.2f} (+{DECODE_NOISE} noise)")


def _auto_choice(row: dict[str, Any]) -> Check:
    if row["cell"] != AUTO:
        return Check("auto_choice", row["cell"], "n/a", "")
    if "same_answers_as_chosen" not in row:
        return Check("auto_choice", AUTO, "FAIL", f"chose {row.get('chose')!r}, which no cell of the run ran")
    same, ratio = row["same_answers_as_chosen"], row["decode_ratio_to_chosen"]
    ok = same == 1.0 and ratio >= 1.0 - DECODE_NOISE
    return Check("auto_choice", AUTO, "PASS" if ok else "FAIL",
                 f"chose {row['chose']}: same answers on {100 * same:.0f}% of prompts, decode {ratio:.2f}x its")


def evaluate(results: list[dict[str, Any]], rows: list[dict[str, Any]], baseline: str) -> list[Check]:
    by_cell = {r["cell"]: r for r in results}
    base = by_cell[baseline]
    out: list[Check] = []
    for row in rows:
        result = by_cell[row["cell"]]
        out += [_retrieval(result, base), _residency(result), _decode_cost(result, row), _auto_choice(row)]
    return out


def checks_markdown(checks: list[Check]) -> str:
    cells = list(dict.fromkeys(c.cell for c in checks))
    status = {(c.cell, c.check): c for c in checks}
    lines = ["| cell | " + " | ".join(CHECKS) + " |", "|---" * (len(CHECKS) + 1) + "|"]
    for cell in cells:
        lines.append(f"| {cell} | " + " | ".join(status[(cell, name)].status for name in CHECKS) + " |")
    lines.append("")
    lines += [f"- {c.cell}, {c.check}: {c.status} ({c.detail})" for c in checks if c.status != "n/a"]
    return "\n".join(lines) + "\n"
