"""Faults on a real local cluster: what the driver sees, what is lost, what is recomputed, how long
recovery takes.

Run: ``.venv/bin/python -m benchmarks.faults [--quick] [--model PATH] [--scenarios a,b]
[--prompt 300] [--tokens 64] [--out DIR]``
Writes ``faults.json`` and ``faults.png`` (recovery time per scenario beside the same call without
the fault) into DIR (default benchmarks/results) and prints the table.

One fresh local Ray cluster (stories260K by default; one llama backend, one cold store whose RAM
tier is tiny so blocks go to its disk tier) runs each scenario once (``benchmarks.faults.
scenarios``): SIGKILL of the backend between calls, mid-generate, mid-append and while a session
is suspended; of the cold store while sessions are suspended and during four concurrent resumes;
of the planner before a session is placed; an append that runs past the budget; damaged block
files (corrupt, truncated, forged, swapped); a full disk (run as root only: the disk tier is then
a tmpfs this command mounts, so that it can be filled); a re-based streaming session whose backend
dies (the one case whose recompute cannot be exact: reported, not hidden); a stream abandoned by
its consumer; another driver SIGKILLed during its ``generate`` (the orphaned call's tokens read with
``Session.tokens()``); two dozen bad arguments (each must be refused with a kvres error, the
backend must not crash). Then, each on a cluster of its own (``benchmarks.faults.more_scenarios``):
a worker node removed from a head + worker ``ray.cluster_utils.Cluster`` (sessions live,
suspended, streamed, migrated away and spilled there; each beside an uninterrupted twin), a head
restart of a standing cluster with GCS fault tolerance (its own ``redis-server``), and one
without it (every session lost: the row says whether the user was told).

Columns: the error the driver saw ("none": the call was repeated for it and answered), sessions
the fault lost and those that continued with the fault-free greedy tokens (of those it hit),
tokens lost (committed tokens missing afterwards; must be 0), tokens recomputed from the log
(inexact ones apart), seconds from the fault to the answer of the next call (of the last session,
where it hit several), the same call's seconds in a fault-free run of the same session (the
baseline, measured in the same run; "-" where there is none). ``--quick`` runs seven scenarios
with small calls (no node death, no head restart: tests/multinode and tests/faults cover them).
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import traceback
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from .cluster import FaultCluster, TmpfsDisk
from .more_scenarios import ON_CLUSTER, SOLO
from .scenarios import QUICK as QUICK_ACTORS
from .scenarios import SCENARIOS as ACTOR_SCENARIOS
from .scenarios import Row, Sizes

SCENARIOS = {**ACTOR_SCENARIOS, **ON_CLUSTER}  # on the benchmark's cluster
ALL = [*SCENARIOS, *SOLO]  # SOLO: each on a cluster of its own, after the others
QUICK = (*QUICK_ACTORS, "abandoned-stream", "bad-arguments")

ROOT = Path(__file__).resolve().parents[2]
SHARED_MODEL = ROOT.parent / "shared" / "models" / "stories260K.gguf"
TMPFS_BYTES = 32 << 20


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--model", default=str(SHARED_MODEL))
    parser.add_argument("--quick", action="store_true", help="five scenarios, small calls")
    parser.add_argument("--scenarios", default=None, help=f"comma-separated, of: {', '.join(ALL)}")
    parser.add_argument("--prompt", type=int, default=None)
    parser.add_argument("--tokens", type=int, default=None)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = parser.parse_args(argv)
    names = args.scenarios.split(",") if args.scenarios else list(QUICK if args.quick else ALL)
    unknown = [n for n in names if n not in ALL]
    if unknown:
        parser.error(f"unknown scenario(s) {unknown}; known: {ALL}")
    solo = [n for n in names if n in SOLO]
    names = [n for n in names if n not in SOLO]
    base = Sizes(64, 16, 128, 600) if args.quick else Sizes()
    sizes = Sizes(args.prompt or base.prompt, args.tokens or base.tokens, base.long_generate, base.long_append)

    rows: list[dict[str, Any]] = []
    with ExitStack() as stack:
        disk, tmpfs, skipped = _disk(stack, "disk-full" in names)
        if skipped:
            names.remove("disk-full")
            rows.append({**Row("disk full under spills and a suspend, backend killed").as_dict(),
                         "error": "not run", "note": skipped})
        cluster = FaultCluster(args.model, disk, tmpfs=tmpfs)
        stack.callback(cluster.shutdown)
        for name in names:
            rows.append(_run(name, lambda name=name: SCENARIOS[name](cluster, sizes)))
    if solo:
        with tempfile.TemporaryDirectory(prefix="kvres-bench-faults-") as tmp:
            for name in solo:
                rows.append(_run(name, lambda name=name: SOLO[name](args.model, sizes, Path(tmp))))
    result = {"model": args.model, "quick": args.quick, "sizes": sizes.__dict__, "rows": rows,
              "tokens_lost": sum(r["tokens_lost"] for r in rows),
              "sessions_lost": sum(r["sessions_lost"] for r in rows if r["name"] != "head-restart-no-ft")}
    print()
    print(table(rows))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "faults.json").write_text(json.dumps(result, indent=2))
    _plot(rows, args.out / "faults.png")
    return result


def _run(name: str, scenario: Any) -> dict[str, Any]:
    try:
        row = scenario().as_dict()
    except Exception as exc:  # a scenario that breaks is a finding: shown in the table
        traceback.print_exc()
        row = {**Row(name).as_dict(), "error": f"scenario failed: {type(exc).__name__}: {exc}"[:300],
               "same_tokens": False, "identical": 0}
    row["name"] = name
    print(_line(row), flush=True)
    return row


def _disk(stack: ExitStack, want_tmpfs: bool) -> tuple[Path, bool, str]:
    """The cold store's disk folder: a tmpfs of its own when the disk-full scenario runs and a
    tmpfs can be mounted, else a private temporary folder (and the reason disk-full is not run)."""
    reason = ""
    if want_tmpfs:
        try:
            mounted = stack.enter_context(TmpfsDisk(TMPFS_BYTES))
            return mounted.path, True, ""
        except OSError as exc:
            reason = f"needs a tmpfs of its own: {exc}"
    folder = Path(tempfile.mkdtemp(prefix="kvres-bench-faults-"))
    stack.callback(shutil.rmtree, folder, True)
    return folder, False, reason


COLUMNS = ("scenario", "error seen", "sessions lost", "continuations identical", "tokens lost", "recomputed",
           "inexact", "recover s", "fault-free s")


def _cells(r: dict[str, Any]) -> list[str]:
    return [r["scenario"], r["error"], f"{r['sessions_lost']}/{r['sessions']}", f"{r['identical']}/{r['sessions']}",
            str(r["tokens_lost"]), str(r["tokens_recomputed"]), str(r["inexact_tokens"]), f"{r['recover_s']:.2f}",
            f"{r['baseline_s']:.2f}" if r["baseline_s"] > 0 else "-"]


def _line(r: dict[str, Any]) -> str:
    return " | ".join(_cells(r)) + (f" ({r['note']})" if r.get("note") else "")


def table(rows: list[dict[str, Any]]) -> str:
    """The rows as a Markdown table (notes below it)."""
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(_cells(r)) + " |" for r in rows]
    notes = [f"- {r['scenario']}: {r['note']}" for r in rows if r.get("note")]
    return "\n".join(lines + ([""] + notes if notes else []))


def _plot(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = [r for r in rows if r["recover_s"] > 0]
    fig, ax = plt.subplots(figsize=(10, 0.5 * len(shown) + 1.5))
    y = list(range(len(shown)))
    ax.barh([i + 0.2 for i in y], [r["recover_s"] for r in shown], height=0.4, label="fault to next answer")
    ax.barh([i - 0.2 for i in y], [r["baseline_s"] for r in shown], height=0.4, label="same call, no fault")
    ax.set_yticks(y, [r["scenario"] for r in shown], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("seconds")
    lost = sum(r["sessions_lost"] for r in rows if r["name"] != "head-restart-no-ft")
    ax.set_title("kvres: time to recover from a fault (tokens lost: "
                 f"{sum(r['tokens_lost'] for r in rows)}; sessions lost: {lost}, a head restart without GCS "
                 "fault tolerance apart)", fontsize=9)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.1), ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


if __name__ == "__main__":
    main()
