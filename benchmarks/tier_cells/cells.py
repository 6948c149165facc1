"""The four cells of the T* table and how one is run through ``kvres.cluster`` sessions.

Primitives:
- ``Cell(name, type_k, type_v, kv_budget_tokens, spills, env)``: one backend configuration, whether
  its tier spills, and the environment its Ray cluster runs with (the T* inputs reach the backend actor through
  ``runtime_env``). ``reference_cells(n_ctx, resident_tokens, pinned_env=None)``: three cells of one
  environment, T* on with its inputs pinned (``FORCED_SPILL``): f16 resident (the whole context
  fits, so there is nothing to choose and the config stays as it is), f16 + spill (T* keeps f16
  and spills), q8_0 resident (explicit types turn the choice off). ``auto_cell(budget_tokens,
  env=None)``: auto (T* on with the probes measured on this machine and model; a budget the
  f16 cache of the context does not fit and the q8_0 one does, so T* chooses between spilling f16
  and quantizing, as in the seed's validation). ``twin_cell(decision, kv_budget_tokens,
  reference)``: a pinned reference cell for auto's choice when none of the three runs it.
- ``run_cells(group, model, n_ctx, tasks, decode_tokens, repeats, threads, disk_dir) -> list[dict]``:
  starts a local Ray cluster with one backend per cell of ``group`` (cells of one environment),
  and per cell reads its tier decision, answers every task in two turns (``two_turns``), times
  decoding (``decode_rate``); then shuts the cluster down.
- ``two_turns(session, task) -> (ids, stats)``: turn 1 appends the context, turn 2 the question
  and generates the answer.
- ``decode_rate(manager, backend, prompt, tokens, repeats) -> dict``: ``generate(tokens)`` after a
  prompt, one Ray call, over ``repeats`` fresh sessions: the best tokens/s (what the table uses: on
  a shared host other work only ever slows a run down) and the median.
- ``chosen_cell(decision, kv_budget_tokens, table) -> str``: the cell a tier decision lands on.
"""

from __future__ import annotations

import statistics
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from models import passkey_tasks as pt

F16_RESIDENT, F16_SPILL, Q8_RESIDENT, AUTO = "f16 resident", "f16 + spill", "q8_0 resident", "auto"
CELL_NAMES = (F16_RESIDENT, F16_SPILL, Q8_RESIDENT, AUTO)
AUTO_ON = {"KVRES_KV_AUTO_TIER": "1"}
# c_engage 0 and a target drop of 1 make T* the whole resident step's bytes: f16 is kept and spills
FORCED_SPILL = {**AUTO_ON, "KVRES_HOST_RAM_GBPS": "10", "KVRES_VRAM_GBPS": "10", "KVRES_C_ENGAGE_MS": "0",
                "KVRES_KV_TSTAR_DROP": "1"}


@dataclass(frozen=True)
class Cell:
    name: str
    type_k: str | None  # None: the backend's default (f16), left to T* where it is on
    type_v: str | None
    kv_budget_tokens: int
    spills: bool
    env: dict[str, str] = field(default_factory=dict)


def reference_cells(n_ctx: int, resident_tokens: int, pinned_env: dict[str, str] | None = None) -> list[Cell]:
    pinned = {**FORCED_SPILL, **(pinned_env or {})}
    return [
        Cell(F16_RESIDENT, None, None, n_ctx, False, pinned),
        Cell(F16_SPILL, None, None, resident_tokens, True, pinned),
        Cell(Q8_RESIDENT, "q8_0", "q8_0", n_ctx, False, pinned),
    ]


def auto_cell(budget_tokens: int, env: dict[str, str] | None = None) -> Cell:
    return Cell(AUTO, None, None, budget_tokens, False, {**AUTO_ON, **(env or {})})


def twin_cell(decision: dict[str, Any] | None, kv_budget_tokens: int, reference: list[Cell]) -> Cell | None:
    """A reference cell for what auto chose when no cell of ``reference`` runs it: f16 spilling at
    auto's own budget (the pinned environment reproduces that choice). None when a reference cell
    matches, or when the choice (a quantized tier that spills) cannot be pinned."""
    if decision is None or chosen_cell(decision, kv_budget_tokens, reference) in {c.name for c in reference}:
        return None
    if decision["chosen"] != "f16/f16" or decision["chosen_spill_bytes"] <= 0:
        return None
    return Cell(f"{F16_SPILL} ({kv_budget_tokens} tokens)", None, None, kv_budget_tokens, True, reference[0].env)


def chosen_cell(decision: dict[str, Any] | None, kv_budget_tokens: int, table: list[Cell]) -> str:
    """The cell whose configuration a backend with ``decision`` runs: its KV types, and its
    budget when the tier spills; otherwise the tier's own name."""
    if decision is None:
        return F16_RESIDENT
    spills = decision["chosen_spill_bytes"] > 0
    name = f"{decision['chosen']} {'+ spill' if spills else 'resident'}"
    for cell in table:
        if cell.name == AUTO:
            continue
        types = f"{cell.type_k or 'f16'}/{cell.type_v or 'f16'}"
        if types == decision["chosen"] and cell.spills == spills and (
                not spills or cell.kv_budget_tokens == kv_budget_tokens):
            return cell.name
    return name


def two_turns(session: Any, task: pt.PasskeyTask) -> tuple[list[int], dict[str, Any]]:
    q0 = task.question_span[0]
    session.append(task.prompt_ids[:q0])
    session.append(task.prompt_ids[q0:])
    return session.generate(len(task.answer_ids)), session.stats()


def decode_rate(manager: Any, backend: str, prompt: list[int], tokens: int, repeats: int) -> dict[str, Any]:
    rates: list[float] = []
    for _ in range(repeats):
        session = manager.open_session(backend=backend)
        try:
            session.append(prompt)
            t0 = time.perf_counter()
            got = session.generate(tokens)
            rates.append(len(got) / (time.perf_counter() - t0))
        finally:
            session.close()
    return {"tokens": tokens, "repeats": repeats, "tokens_per_s": max(rates),
            "median_tokens_per_s": statistics.median(rates), "all": rates}


def backend_name(cell: Cell) -> str:
    return "cell-" + "".join(c if c.isalnum() else "-" for c in cell.name).strip("-")


def run_cells(group: list[Cell], model: Path, n_ctx: int, tasks: dict[int, list[pt.PasskeyTask]],
              decode_tokens: int, repeats: int, threads: int, disk_dir: Path) -> list[dict[str, Any]]:
    """Cells of one environment on one local Ray cluster (a backend each), one after another."""
    import ray

    from kvres.cluster import BackendConfig, ColdStoreConfig, KvresConfig, connect

    env = group[0].env
    if any(cell.env != env for cell in group):
        raise ValueError(f"cells {[c.name for c in group]} need different environments: one cluster each")
    backends = []
    for cell in group:
        types = {k: v for k, v in (("type_k", cell.type_k), ("type_v", cell.type_v)) if v is not None}
        backends.append(BackendConfig(name=backend_name(cell), model_path=model, n_ctx=n_ctx,
                                      kv_budget_tokens=cell.kv_budget_tokens, n_seq_max=2, n_threads=threads,
                                      **types))
    config = KvresConfig(backends=backends, cold_store=ColdStoreConfig(
        ram_budget_bytes=16 << 20, disk_budget_bytes=64 << 20, disk_dir=disk_dir))
    if ray.is_initialized():
        ray.shutdown()
    manager = connect(namespace=f"kvres-tier-cells-{uuid.uuid4().hex[:8]}", config=config, num_cpus=2,
                      include_dashboard=False, runtime_env={"env_vars": dict(env)})
    try:
        return [_run_cell(manager, cell, tasks, decode_tokens, repeats) for cell in group]
    finally:
        manager.shutdown()
        ray.shutdown()


def _run_cell(manager: Any, cell: Cell, tasks: dict[int, list[pt.PasskeyTask]], decode_tokens: int,
              repeats: int) -> dict[str, Any]:
    import ray

    backend = backend_name(cell)
    t0 = time.perf_counter()
    stats = ray.get(manager.backend_handle(backend).stats.remote())
    answers: list[dict[str, Any]] = []
    for family, family_tasks in tasks.items():
        for i, task in enumerate(family_tasks):
            session = manager.open_session(backend=backend)
            try:
                got, st = two_turns(session, task)
            finally:
                session.close()
            answers.append({
                "family": family, "index": i, "depth": task.depth, "n_tokens": task.n_tokens,
                "correct": got == task.answer_ids, "answer": got, "expected": task.answer_ids,
                "policy": st["policy"]["kind"], "resident_tokens": st["resident_tokens"],
                "peak_resident_tokens": st["peak_resident_tokens"],
                "recalled_tokens": st["counters"]["recalled_tokens"], "recall_us": st["counters"]["recall_us"],
                "spilled_bytes": st["counters"]["spilled_bytes"],
            })
    first = next(iter(tasks.values()))[0]
    decode = decode_rate(manager, backend, first.prompt_ids, decode_tokens, repeats)
    probe = manager.open_session(backend=backend)
    try:
        policy = probe.stats()["policy"]
    finally:
        probe.close()
    accuracy = {str(f): sum(a["correct"] for a in answers if a["family"] == f) / len(ts) for f, ts in tasks.items()}
    return {
        "cell": cell.name, "env": cell.env, "kv_types": list(stats["kv_types"]),
        "kv_budget_tokens": stats["kv_budget_tokens"], "tier_decision": stats["tier_decision"],
        "session_policy": policy, "accuracy": accuracy, "decode": decode, "answers": answers,
        "seconds": round(time.perf_counter() - t0, 1),
    }
