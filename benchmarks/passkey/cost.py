"""What a scorer costs: a session's ``append`` (prefill + compression) and ``generate(512)`` under each
scored policy, as ratios to streaming's, measured in the same run on the same backend.

Primitives:
- ``COST_METHODS``: ``streaming`` (the baseline), ``snapkv``, ``h2o``, ``keynorm``, ``full``.
- ``measure_cost(manager, engine, task, fraction, tokens, repeats, cfg) -> dict``: per method the
  median seconds of the prompt's ``append`` and of ``generate(tokens)``, their ratios to
  streaming's, and the resident tokens at the end; the methods take turns within each repeat so
  that a slow moment of the host hits all of them alike.

A scored session compresses once after its prompt and once at the end of a generate (it grows in
between), a streaming one evicts a few blocks every few tokens; the full cache never evicts.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

from models import passkey_tasks as pt

from .harness import EvalConfig
from .sessions import backend_name, policy_for

COST_METHODS = ("streaming", "snapkv", "h2o", "keynorm", "full")


def _once(manager: Any, backend: str, task: pt.PasskeyTask, method: str, fraction: float, tokens: int,
          cfg: EvalConfig) -> tuple[float, float, int]:
    policy = policy_for(method, task, fraction, cfg)
    assert policy is not None
    session = manager.open_session(policy=policy, backend=backend)
    try:
        t0 = time.perf_counter()
        session.append(task.prompt_ids)
        t1 = time.perf_counter()
        session.generate(tokens)
        t2 = time.perf_counter()
        return t1 - t0, t2 - t1, int(session.stats()["resident_tokens"])
    finally:
        session.close()


def measure_cost(
    manager: Any, engine: str, task: pt.PasskeyTask, fraction: float, tokens: int, repeats: int,
    cfg: EvalConfig | None = None,
) -> dict[str, Any]:
    cfg = cfg or EvalConfig()
    backend = backend_name(engine)
    runs: dict[str, list[tuple[float, float, int]]] = {m: [] for m in COST_METHODS}
    _once(manager, backend, task, "streaming", fraction, min(tokens, 16), cfg)  # warm-up
    for _ in range(repeats):
        for method in COST_METHODS:
            runs[method].append(_once(manager, backend, task, method, fraction, tokens, cfg))
    append_s = {m: statistics.median(r[0] for r in rs) for m, rs in runs.items()}
    generate_s = {m: statistics.median(r[1] for r in rs) for m, rs in runs.items()}
    return {
        "prompt_tokens": task.n_tokens, "budget": fraction, "generate_tokens": tokens, "repeats": repeats,
        "methods": {
            m: {
                "append_s": round(append_s[m], 4), "generate_s": round(generate_s[m], 4),
                "append_ratio": round(append_s[m] / append_s["streaming"], 3),
                "generate_ratio": round(generate_s[m] / generate_s["streaming"], 3),
                "resident_tokens": runs[m][-1][2],
            }
            for m in COST_METHODS
        },
    }
