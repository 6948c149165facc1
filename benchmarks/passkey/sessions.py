"""Passkey answers through ``kvres.cluster`` sessions: one policy per method, one session per answer.

Primitives:
- ``METHODS``: what each engine runs. llama.cpp and OpenVINO: ``full`` (``SessionPolicy()``),
  ``streaming`` (sinks + recent window, positions re-based), ``snapkv``, ``h2o``, ``keynorm``
  (``kind="scored"``, compress after prefill, position gaps kept); llama.cpp also ``snapkv-3x``
  (``OVERSIZE``: SnapKV on a backend whose whole budget, ``oversize_room``, is a third of the
  prompt, so the prompt is scored while it still comes in, by its own last tokens); openvino-genai:
  ``full`` and ``genai`` (its own eviction, ``SessionPolicy.engine_evicts``, NORM_SUM).
- ``backend_configs(model, engines, threads, n_tokens=384)``: one ``BackendConfig`` per engine,
  named after it (``backend_name(engine, method)``), and the small-room backend of ``OVERSIZE``.
- ``policy_for(method, task, fraction, cfg) -> SessionPolicy | None``: the session policy of a
  method at a budget; ``None`` where the engine cannot hold that budget (genai: whole 32-token KV
  blocks, at least 96 tokens).
- ``answer(manager, backend, task, policy) -> (ids, stats)``: open a session, append the prompt
  ids, generate as many tokens as the passkey has digits, read its stats, close it.
- ``evaluate(manager, engine, tasks, methods, budgets, cfg) -> list[Record]``: every task under
  every (method, budget) on one engine's backend, one session at a time.

A scored session prefills the whole prompt, then is cut to its budget by its scorer (SnapKV: the
attention of the question rows; H2O: of every processed row; KeyNorm: key norms), so the first
answer token comes from the full prefill, as in SnapKV; a streaming session is evicted while it
prefills (chunks that fit its budget). genai likewise evicts once the prompt is processed.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from kvres.actors.engines.openvino.genai import KV_BLOCK
from kvres.cluster import BackendConfig, SessionPolicy
from models import passkey_tasks as pt

from .harness import EvalConfig, Record, budget_tokens, decode_answer

LLAMA, OPENVINO, GENAI = "llama.cpp", "openvino", "openvino-genai"
ENGINES = (LLAMA, OPENVINO, GENAI)
SCORED = ("snapkv", "h2o", "keynorm")
OVERSIZE = "snapkv-3x"  # SnapKV on a backend whose free room is a third of the prompt
METHODS: dict[str, tuple[str, ...]] = {
    LLAMA: ("full", "streaming", *SCORED, OVERSIZE),
    OPENVINO: ("full", "streaming", *SCORED),
    GENAI: ("full", "genai"),
}
GENAI_MIN_CACHE = 3 * KV_BLOCK  # genai keeps >= one block of sinks, one recent, one evictable
_ENGINE_OPTIONS: dict[str, dict[str, Any]] = {
    LLAMA: {"engine": "llama"},
    OPENVINO: {"engine": "openvino", "openvino_mode": "state"},
    GENAI: {"engine": "openvino-genai"},
}


def backend_name(engine: str, method: str | None = None) -> str:
    """The backend a method runs on: the engine's, or for ``OVERSIZE`` its small-room twin."""
    name = {LLAMA: "llama", OPENVINO: "openvino", GENAI: "genai"}[engine]
    return f"{name}-3x" if method == OVERSIZE else name


def oversize_room(n_tokens: int) -> int:
    """The small-room backend's whole budget: a prompt of ``n_tokens`` is 3x its free room."""
    return math.ceil(n_tokens / 3)


def backend_configs(model: Path, engines: Iterable[str], threads: int = 1, n_tokens: int = 384) -> list[BackendConfig]:
    engines = list(engines)
    configs = [
        BackendConfig(name=backend_name(e), model_path=model, n_ctx=2048, n_seq_max=2, kv_budget_tokens=2000,
                      n_threads=threads, **_ENGINE_OPTIONS[e])
        for e in engines
    ]
    configs += [BackendConfig(name=backend_name(e, OVERSIZE), model_path=model, n_ctx=2048, n_seq_max=2,
                              kv_budget_tokens=oversize_room(n_tokens), n_threads=threads, **_ENGINE_OPTIONS[e])
                for e in engines if OVERSIZE in METHODS[e]]
    return configs


def genai_budget(budget: int) -> int | None:
    """The largest cache genai can keep within ``budget``: whole KV blocks, >= its 96-token floor."""
    cache = budget // KV_BLOCK * KV_BLOCK
    return cache if cache >= GENAI_MIN_CACHE else None


def policy_for(method: str, task: pt.PasskeyTask, fraction: float, cfg: EvalConfig) -> SessionPolicy | None:
    if method == "full":
        return SessionPolicy()
    budget = budget_tokens(task, fraction, cfg)
    recent = cfg.recent_tokens(task)
    if method == "genai":
        cache = genai_budget(budget)
        return None if cache is None or cache >= task.n_tokens else SessionPolicy.engine_evicts(cache, cfg.sink_tokens, recent)
    if method == OVERSIZE:
        if budget > oversize_room(task.n_tokens) - cfg.block_size:
            return None  # the session's budget must leave the small backend room to compress into
        method, kind, scorer = "snapkv", "scored", "snapkv"
    elif method == "streaming":
        kind, scorer = "streaming", "snapkv"
    elif method in SCORED:
        kind, scorer = "scored", method
    else:
        raise ValueError(f"unknown method {method!r}; known: full, streaming, {', '.join(SCORED)}, genai")
    return SessionPolicy(kind=kind, scorer=scorer, budget_tokens=budget,
                         sink_tokens=cfg.sink_tokens, recent_tokens=recent, block_size=cfg.block_size,
                         observation_window=cfg.observation_window(task), rebase=method in cfg.rebase,
                         spill=False)


def answer(manager: Any, backend: str, task: pt.PasskeyTask, policy: SessionPolicy) -> tuple[list[int], dict[str, Any]]:
    session = manager.open_session(policy=policy, backend=backend)
    try:
        session.append(task.prompt_ids)
        got = session.generate(len(task.answer_ids))
        return got, session.stats()
    finally:
        session.close()


def evaluate(
    manager: Any,
    engine: str,
    tasks: Sequence[pt.PasskeyTask],
    methods: Iterable[str],
    budgets: Iterable[float],
    cfg: EvalConfig | None = None,
) -> list[Record]:
    """``full`` once per task (budget 1.0), the other methods at every budget they can run at."""
    cfg = cfg or EvalConfig()
    methods, budgets = list(methods), list(budgets)
    managed = engine == GENAI
    records: list[Record] = []
    for i, task in enumerate(tasks):
        for method in methods:
            for frac in [1.0] if method == "full" else budgets:
                policy = policy_for(method, task, frac, cfg)
                if policy is None:
                    continue
                got, stats = answer(manager, backend_name(engine, method), task, policy)
                records.append(Record(
                    engine=engine, family=task.family, method=method, budget=float(frac),
                    budget_tokens=policy.budget_tokens or task.n_tokens,
                    resident_tokens=None if managed else int(stats["resident_tokens"]),
                    peak_resident_tokens=None if managed else int(stats["peak_resident_tokens"]),
                    depth=float(task.depth), n_tokens=task.n_tokens, seed_index=i,
                    correct=got == task.answer_ids, answer=decode_answer(got), expected=task.answer,
                ))
    return records
