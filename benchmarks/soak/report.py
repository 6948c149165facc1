"""What a soak run shows: turns, failures and retries, faults and their windows, the audit, memory.

Primitives:
- ``turns_of(attempts) -> list[Turn]``: the attempts of each (conversation, turn) together: when
  its first try started, whether and when it completed (the ``ok`` attempt), its time to first
  token and latency from its first try (refusal waits and the retry included), its tries.
- ``in_flight_at(attempt, kills) -> bool``: a kill happened while the attempt ran.
- ``fault_rows(faults, turns, window_s) -> list[dict]``: per fault made: ``recover_s`` (from the
  kill to the end of the first turn started after it that completed), ``all_clients_s`` (until
  every client that went on completed such a turn), and p50 / p99 of latency and time to first
  token of the turns that ran in the ``window_s`` before the kill (started and ended there), of
  those that ran at any moment between the kill and ``all_clients_s`` ("during": a turn the kill
  hit counts here, its retry included), and of those started in the ``window_s`` after that
  (windows end at the neighbouring faults).
- ``summarize(attempts, audits, faults, rss, settings) -> dict``: every figure of the run, and
  ``invariants`` (what must hold whatever the machine: no session lost, no token lost or
  duplicated, every failed try in flight at a kill and its turn completed by the retry, every
  fault recovered) and ``bars`` (the issue's thresholds, timing ones included).
- ``plot(result, samples, attempts, path)``: the PNG timeline: each turn's latency over the run
  with the kills marked, and each kind of process's resident memory.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .audit import AuditRow
from .faults import Fault
from .memory import Sample
from .traffic import Attempt

RECOVER_BAR_S = 30.0
P99_BAR = 1.5
RSS_BAR_PCT = 10.0
QUIET_SLOPE_BAR_MIB_PER_MIN = 1.0  # without faults: every process's resident memory together


@dataclass
class Turn:
    client: int
    conversation: str
    turn: int
    start: float
    end: float | None  # None: never completed
    ttft: float | None
    tries: int  # attempts the server took (ok or failed)
    refusals: int

    @property
    def latency(self) -> float | None:
        return None if self.end is None else self.end - self.start


def turns_of(attempts: Sequence[Attempt]) -> list[Turn]:
    grouped: dict[tuple[str, int], list[Attempt]] = defaultdict(list)
    for a in attempts:
        grouped[(a.conversation, a.turn)].append(a)
    turns = []
    for (conversation, turn), rows in grouped.items():
        rows.sort(key=lambda a: a.start)
        ok = next((a for a in rows if a.outcome == "ok"), None)
        start = rows[0].start
        turns.append(Turn(rows[0].client, conversation, turn, start, ok.end if ok else None,
                          None if ok is None or ok.first_token is None else ok.first_token - start,
                          sum(1 for a in rows if a.outcome in ("ok", "failed")),
                          sum(1 for a in rows if a.outcome == "refused")))
    return sorted(turns, key=lambda t: t.start)


def in_flight_at(attempt: Attempt, kills: Sequence[float]) -> bool:
    return any(attempt.start <= k <= attempt.end for k in kills)


def _pct(values: Sequence[float], q: float) -> float | None:
    return round(float(np.percentile(np.asarray(values, dtype=np.float64), q)), 4) if values else None


def window(turns: Sequence[Turn], lo: float, hi: float, overlapping: bool = False,
           ended_by: float | None = None) -> dict[str, Any]:
    """The completed turns started in ``[lo, hi)`` (``ended_by``: and ended before it), or with
    ``overlapping`` those that ran at any moment of it."""
    if overlapping:
        done = [t for t in turns if t.end is not None and t.start < hi and t.end >= lo]
    else:
        done = [t for t in turns if lo <= t.start < hi and t.end is not None and (ended_by is None or t.end < ended_by)]
    lat = [t.latency for t in done if t.latency is not None]
    ttft = [t.ttft for t in done if t.ttft is not None]
    return {"from_s": round(lo, 2), "to_s": round(hi, 2), "turns": len(done),
            "latency_p50_s": _pct(lat, 50), "latency_p99_s": _pct(lat, 99),
            "ttft_p50_s": _pct(ttft, 50), "ttft_p99_s": _pct(ttft, 99)}


def _recovery(fault: Fault, turns: Sequence[Turn]) -> tuple[float | None, float | None]:
    assert fault.at_s is not None
    after = [t for t in turns if t.start >= fault.at_s and t.end is not None]
    if not after:
        return None, None
    first = min(t.end for t in after if t.end is not None) - fault.at_s
    per_client: dict[int, float] = {}
    for t in after:
        assert t.end is not None
        per_client[t.client] = min(per_client.get(t.client, t.end), t.end)
    return first, max(per_client.values()) - fault.at_s


def fault_rows(faults: Sequence[Fault], turns: Sequence[Turn], window_s: float) -> list[dict[str, Any]]:
    made = [f for f in faults if f.at_s is not None]
    rows = []
    for i, fault in enumerate(made):
        assert fault.at_s is not None
        first, everyone = _recovery(fault, turns)
        kill = fault.at_s
        settled = kill + (everyone if everyone is not None else window_s)
        previous_end = -np.inf if i == 0 else made[i - 1].at_s
        next_kill = made[i + 1].at_s if i + 1 < len(made) else np.inf
        assert previous_end is not None and next_kill is not None
        rows.append({
            "kind": fault.kind, "pid": fault.pid, "at_s": round(kill, 2), "planned_s": round(fault.planned_s, 2),
            "recover_s": None if first is None else round(first, 2),
            "all_clients_s": None if everyone is None else round(everyone, 2),
            "before": window(turns, max(kill - window_s, previous_end), kill, ended_by=kill),
            "during": window(turns, kill, min(settled, next_kill), overlapping=True),
            "after": window(turns, settled, min(settled + window_s, next_kill)),
        })
    return rows


def _failures(attempts: Sequence[Attempt], turns: Sequence[Turn], kills: Sequence[float]) -> dict[str, Any]:
    failed = [a for a in attempts if a.outcome == "failed"]
    at_kill = [a for a in failed if in_flight_at(a, kills)]
    other = [a for a in failed if not in_flight_at(a, kills)]
    retried = {(a.conversation, a.turn) for a in failed}
    by_key = {(t.conversation, t.turn): t for t in turns}
    retry_failed = [a for a in failed if a.retry >= 1]
    unrecovered = [k for k in retried if by_key[k].end is None]
    return {
        "failed_tries": len(failed), "failed_in_flight_at_a_kill": len(at_kill),
        "failed_not_at_a_kill": len(other), "turns_failed": len(retried),
        "retries_failed": len(retry_failed), "turns_never_completed_after_a_failure": len(unrecovered),
        "turns_completed_by_the_retry": sum(1 for k in retried if by_key[k].end is not None and by_key[k].tries == 2),
        "examples_not_at_a_kill": [f"{a.api} {a.conversation} turn {a.turn} try {a.retry} at {a.start:.1f}-"
                                   f"{a.end:.1f} s: {a.error}" for a in other[:10]],
        "examples_at_a_kill": [f"{a.api} turn {a.turn} at {a.start:.1f}-{a.end:.1f} s: {a.error}" for a in at_kill[:10]],
    }


def _audit(audits: Sequence[AuditRow], attempts: Sequence[Attempt]) -> dict[str, Any]:
    bad = [r for r in audits if not r.ok]
    rewound = [a for a in attempts if a.outcome == "ok" and a.rewound]
    return {
        "conversations": len(audits), "audited": sum(1 for r in audits if r.turns),
        "sessions_lost": sum(1 for r in audits if r.lost), "mismatched": sum(1 for r in bad if not r.lost),
        "broken": sum(1 for r in audits if r.broken),
        "tokens_lost": sum(max(0, r.expected_tokens - r.log_tokens) for r in bad if not r.lost)
        + sum(a.rewound for a in rewound),
        "tokens_duplicated": sum(max(0, r.log_tokens - r.expected_tokens) for r in bad if not r.lost),
        "turns_that_found_tokens_missing": len(rewound),
        "turns_rerendered": sum(1 for a in attempts if a.outcome == "ok" and a.rerendered),
        "tokens_rerendered": sum(a.rerendered for a in attempts if a.outcome == "ok"),
        "by_api": {api: {"conversations": sum(1 for r in audits if r.api == api),
                         "audited": sum(1 for r in audits if r.api == api and r.turns),
                         "ok": sum(1 for r in audits if r.api == api and r.ok)}
                   for api in sorted({r.api for r in audits})},
        "examples": [{"conversation": r.conversation, "api": r.api, "session": r.session, "turns": r.turns,
                      "lost": r.lost, "expected_tokens": r.expected_tokens, "log_tokens": r.log_tokens,
                      "error": r.error, "session_stats": r.session_stats} for r in bad[:10]],
        "rewound_examples": [f"{a.api} {a.conversation} turn {a.turn}: {a.rewound} tokens not cached" for a in rewound[:10]],
        "rewound_sessions": [{"conversation": r.conversation, "session": r.session, "session_stats": r.session_stats}
                             for r in audits if r.session_stats is not None and r.ok][:10],
    }


def summarize(attempts: Sequence[Attempt], audits: Sequence[AuditRow], faults: Sequence[Fault],
              rss: dict[str, Any], settings: dict[str, Any], wall_s: float) -> dict[str, Any]:
    turns = turns_of(attempts)
    kills = [f.at_s for f in faults if f.at_s is not None]
    window_s = float(settings["window_s"])
    rows = fault_rows(faults, turns, window_s)
    failures = _failures(attempts, turns, kills)
    audit = _audit(audits, attempts)
    refusals: dict[str, int] = defaultdict(int)
    for a in attempts:
        if a.outcome == "refused":
            refusals[f"{a.status} {a.code}"] += 1
    done = [t for t in turns if t.end is not None]
    first_kill = min(kills) if kills else np.inf
    last = rows[-1] if rows else None
    settled = (last["at_s"] + (last["all_clients_s"] or 0.0)) if last else -np.inf
    before_all, after_all = window(turns, 0.0, first_kill, ended_by=first_kill), window(turns, settled, np.inf)
    p99_ratio = (after_all["latency_p99_s"] / before_all["latency_p99_s"]
                 if rows and after_all["latency_p99_s"] and before_all["latency_p99_s"] else None)
    made = [f for f in faults if f.at_s is not None]
    invariants = {
        "every_fault_made": len(made) == len(faults) and not any(f.error for f in faults),
        "no_session_lost": audit["sessions_lost"] == 0,
        "no_token_lost_or_duplicated": audit["mismatched"] == 0 and audit["tokens_lost"] == 0,
        "only_turns_in_flight_at_a_kill_failed": failures["failed_not_at_a_kill"] == 0,
        "every_retry_succeeded": failures["retries_failed"] == 0
        and failures["turns_never_completed_after_a_failure"] == 0,
        "every_fault_recovered": all(r["recover_s"] is not None for r in rows),
    }
    steady = rss.get("steady", {})
    bars = {
        **invariants,
        f"every_fault_recovered_within_{RECOVER_BAR_S:.0f}_s": all(
            r["recover_s"] is not None and r["recover_s"] <= RECOVER_BAR_S for r in rows),
        f"no_process_grew_more_than_{RSS_BAR_PCT:.0f}_pct_after_warmup": bool(steady) and all(
            v["growth_pct"] <= RSS_BAR_PCT for v in steady.values()),
    }
    if rows:
        bars[f"p99_after_the_last_fault_within_{P99_BAR}x_before_the_first"] = (
            p99_ratio is not None and p99_ratio <= P99_BAR)
    else:  # a run without faults (--faults-each 0): issue #49's bars for it instead
        total = rss.get("total") or {}
        bars["no_429_without_faults"] = not any(key.startswith("429") for key in refusals)
        bars[f"memory_grew_under_{QUIET_SLOPE_BAR_MIB_PER_MIN:g}_mib_per_min"] = (
            total.get("slope_mib_per_min") is not None and total["slope_mib_per_min"] < QUIET_SLOPE_BAR_MIB_PER_MIN)
    return {
        "settings": settings, "wall_s": round(wall_s, 1),
        "turns_completed": len(done), "turns_started": len(turns),
        "turns_per_s": round(len(done) / wall_s, 3) if wall_s else None,
        "turn_tries": sum(t.tries for t in turns),
        "refusals": dict(refusals), "unreachable": sum(1 for a in attempts if a.outcome == "unreachable"),
        **failures, "audit": audit,
        "latency": {"before_first_fault": before_all, "after_last_fault": after_all, "p99_after_over_before": p99_ratio,
                    "all": window(turns, -np.inf, np.inf)},
        "faults": rows, "faults_not_made": [{"kind": f.kind, "error": f.error} for f in faults if f.at_s is None],
        "rss": rss, "invariants": invariants, "bars": bars,
    }


def plot(result: dict[str, Any], samples: Sequence[Sample], attempts: Sequence[Attempt], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(13, 8), sharex=True)
    ok = [a for a in attempts if a.outcome == "ok"]
    for api, colour in (("chat", "tab:blue"), ("responses", "tab:green")):
        rows = [a for a in ok if a.api == api]
        top.scatter([a.start for a in rows], [a.latency for a in rows], s=4, c=colour, label=f"{api} turn", alpha=0.6)
    failed = [a for a in attempts if a.outcome == "failed"]
    top.scatter([a.start for a in failed], [a.latency for a in failed], s=30, marker="x", c="tab:red",
                label="failed try")
    refused = [a for a in attempts if a.outcome == "refused"]
    if refused:
        top.scatter([a.start for a in refused], [max(a.latency, 1e-3) for a in refused], s=8, marker="v",
                    c="tab:orange", label="refused (429 / 409)")
    for row in result["faults"]:
        for axis in (top, bottom):
            axis.axvline(row["at_s"], color="grey", lw=0.8, ls="--")
        top.annotate(row["kind"], (row["at_s"], 1.0), xycoords=("data", "axes fraction"), rotation=90, va="top",
                     ha="right", fontsize="small")
    top.set_yscale("log")
    top.set_ylabel("turn latency (s)")
    top.set_title(f"kvres soak: {result['settings']['clients']} HTTP clients, {len(result['faults'])} faults, "
                  f"{result['turns_completed']} turns")
    top.legend(loc="upper left", fontsize="small")
    series: dict[str, dict[float, int]] = defaultdict(lambda: defaultdict(int))
    for t, _, label, rss in samples:
        series[label][t] += rss
    biggest = sorted(series, key=lambda k: -max(series[k].values()))[:9]
    for label in biggest:
        points = sorted(series[label].items())
        bottom.plot([p[0] for p in points], [p[1] / (1 << 20) for p in points], label=label)
    warmup = result["rss"].get("warmup_s")
    if warmup is not None:
        bottom.axvline(warmup, color="black", lw=0.8, ls=":")
    bottom.set_ylabel("resident memory (MiB)")
    bottom.set_xlabel("seconds since the traffic started")
    bottom.legend(loc="upper left", fontsize="x-small", ncol=3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
