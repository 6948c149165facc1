"""T*'s validation table on this machine: f16 resident, f16 + spill, q8_0 resident and the automatic
choice, each through ``kvres.cluster`` sessions on the project's passkey model.

Run: ``.venv/bin/python -m benchmarks.tier_cells [--quick] [--out DIR]`` (default DIR
benchmarks/results). Writes ``tier_cells.json`` (every answer, every cell's tier decision and
session policy, the table, the PASS checks), ``tier_cells.md`` and ``tier_cells.png``.

Each cell is one llama.cpp backend on models/passkey.gguf (n_ctx 512, one thread). The first three
share a local Ray cluster whose environment turns T* on with its inputs pinned (c_engage 0, target
drop 1: T* exceeds any spill here); the auto cell has a cluster of its own (the environment
reaches the backend actors through ``runtime_env``):

- f16 resident: the whole context fits (``kv_budget_tokens`` = n_ctx): nothing to choose, the
  config stays as it is;
- f16 + spill: a resident budget of 25% of the prompt (96 of 384 tokens): T* keeps f16 and
  spills; sessions opened with no policy run as spilling streaming sessions of that budget
  (``kvres.actors.sizing.tier_policy``) whose cold blocks recall brings back when the question arrives;
- q8_0 resident: explicit q8_0/q8_0 (which turns the choice off), the whole context fits;
- auto: T* on, its probes measured in this run on this model (a fresh probe cache), with a budget
  of 75% of the f16 cache of the context: f16 does not fit and q8_0 does, so T* chooses between
  spilling f16 and quantizing (the seed's setup). Its row names the cell it landed on and compares
  its answers and decode speed with that cell's. Where the probes make spilling f16 cheap enough,
  that is f16 spilling at auto's own budget, which no other cell runs: the reference cluster then
  runs it too, pinned ("f16 + spill (384 tokens)"), so the comparison still has a twin.

Then the design's four PASS checks per cell (``checks.py``: retrieval kept, residency as the tier
says, a spill's decode drop within T*'s prediction, auto = the cell it chose), in the JSON
(``checks``) and the table.

Per cell: two-turn passkey accuracy for both needle families (turn 1 appends the context, turn 2
the question, then the answer is generated; 50 prompts per family of 384 tokens, needle in the
middle third, seeds 1000 + family) and decode tokens/s (``generate(120)`` in one call after a
384-token prompt, the best of 9 sessions: on a shared host other work only slows a run down, and
medians of one configuration varied by 15% between cells), as a ratio to f16 resident's in the
same run.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import tempfile
import time
from pathlib import Path
from typing import Any

from models import passkey_tasks as pt

from .cells import F16_RESIDENT, Cell, auto_cell, reference_cells, run_cells, twin_cell
from .checks import checks_markdown, evaluate
from .report import markdown, plot, summarize

REPO = Path(__file__).resolve().parents[2]
DEFAULT_MODEL = REPO / "models" / "passkey.gguf"
N_CTX = 512
N_TOKENS = 384
RESIDENT_FRACTION = 0.25  # of the prompt
AUTO_FRACTION = 0.75  # of the f16 cache of n_ctx: between q8_0's 53% and f16's 100%
MIDDLE_THIRD = (1 / 3, 2 / 3)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="3 prompts per family, generate(16) once")
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results")
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    parser.add_argument("--prompts", type=int, default=None, help="prompts per family (default 50, quick 3)")
    parser.add_argument("--decode-tokens", type=int, default=None, help="default 120 (quick 16)")
    parser.add_argument("--repeats", type=int, default=None, help="decode timings per cell (default 9, quick 1)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--auto-env", nargs="*", default=[], metavar="NAME=VALUE",
                        help="extra environment of the auto cell (e.g. probe overrides)")
    args = parser.parse_args(argv)
    if not args.model.is_file():
        raise SystemExit(f"model not found: {args.model} (train it: python models/train_passkey.py)")
    prompts = args.prompts or (3 if args.quick else 50)
    decode_tokens = args.decode_tokens or (16 if args.quick else 120)
    repeats = args.repeats or (1 if args.quick else 9)
    if N_TOKENS + decode_tokens > N_CTX:
        raise SystemExit(f"--decode-tokens {decode_tokens} + the {N_TOKENS}-token prompt exceed n_ctx {N_CTX}")
    resident = math.ceil(RESIDENT_FRACTION * N_TOKENS)
    auto_budget = math.ceil(AUTO_FRACTION * N_CTX)
    tasks = {f: pt.fixed_task_set(f, prompts, seed=1000 + f, n_tokens=N_TOKENS, depth=MIDDLE_THIRD) for f in (1, 2)}
    model = args.model.resolve()
    t_start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        # each cell's probes in a cache of this run: the auto cell measures its own on this model
        auto_env = {"KVRES_CACHE_DIR": str(Path(tmp) / "auto-probes"),
                    **dict(item.split("=", 1) for item in args.auto_env)}
        reference = reference_cells(N_CTX, resident, {"KVRES_CACHE_DIR": str(Path(tmp) / "pinned-probes")})
        auto = auto_cell(auto_budget, auto_env)

        def run(group: list[Cell], i: int) -> list[dict[str, Any]]:
            got = run_cells(group, model, N_CTX, tasks, decode_tokens, repeats, args.threads, Path(tmp) / f"cold-{i}")
            for r in got:
                print(f"{r['cell']}: {r['kv_types']} budget {r['kv_budget_tokens']}, policy "
                      f"{r['session_policy']['kind']}, accuracy {r['accuracy']}, decode "
                      f"{r['decode']['tokens_per_s']:.0f} tok/s ({r['seconds']:.0f} s)", flush=True)
            return got

        # auto first: what it chose decides whether the reference cluster runs a twin of it too
        [auto_result] = run([auto], 0)
        twin = twin_cell(auto_result["tier_decision"], auto_result["kv_budget_tokens"], reference)
        table = reference + ([twin] if twin is not None else []) + [auto]
        results = run(table[:-1], 1) + [auto_result]
    from kvres.actors.model_files import model_id

    rows = summarize(results, F16_RESIDENT, table)
    meta = {
        "model": str(args.model.relative_to(REPO) if model.is_relative_to(REPO) else args.model),
        "model_id": model_id(model), "n_ctx": N_CTX, "n_tokens": N_TOKENS, "prompts_per_family": prompts,
        "depth": list(MIDDLE_THIRD), "resident_tokens": resident, "auto_budget_tokens": auto_budget,
        "decode_tokens": decode_tokens, "decode_repeats": repeats, "threads": args.threads,
        "seconds": round(time.perf_counter() - t_start, 1),
        "host": {"machine": platform.machine(), "python": platform.python_version(), "cpus": os.cpu_count()},
    }
    checks = evaluate(results, rows, F16_RESIDENT)
    result = {"benchmark": "tier_cells", "meta": meta, "rows": rows, "checks": [c.as_dict() for c in checks],
              "cells": results}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "tier_cells.json").write_text(json.dumps(result, indent=1))
    text = markdown(rows, meta) + "\nThe design's four PASS checks (benchmarks/tier_cells/checks.py):\n\n" \
        + checks_markdown(checks)
    (args.out / "tier_cells.md").write_text(text)
    plot(rows, args.out / "tier_cells.png")
    print(text)
    print(f"wrote {args.out}/tier_cells.json, tier_cells.md, tier_cells.png in {meta['seconds']} s")
    return result


if __name__ == "__main__":
    main()
