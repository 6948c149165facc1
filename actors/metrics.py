"""kvres metrics for the Ray dashboard and Prometheus (``ray.util.metrics``, prefix ``kvres_``).

Primitives:
- ``Metrics``: the recording interface the actors call; ``NullMetrics`` records nothing (plain
  classes used without Ray); ``RayMetrics`` records into Ray's metrics agent.
- Names: kvres_resident_tokens{backend,session}, kvres_backend_resident_tokens{backend},
  kvres_cold_bytes{node,tier}, kvres_cold_blocks{node,tier}, kvres_evictions_total{backend,session},
  kvres_admissions_total, kvres_spills_total, kvres_recomputed_tokens_total,
  kvres_suspends_total, kvres_plan_latency_ms (histogram, {backend}),
  kvres_tokens_total{backend,kind} (kind "prompt": tokens appended, "generated": tokens decoded).
"""

from __future__ import annotations

from typing import Any

COUNTERS = ("evictions", "admissions", "spills", "recomputed_tokens", "suspends", "resumes")


class Metrics:
    def set_resident(self, backend: str, session: str, tokens: int) -> None: ...

    def set_backend_resident(self, backend: str, tokens: int) -> None: ...

    def count(self, name: str, backend: str, session: str, value: int = 1) -> None: ...

    def observe_plan_ms(self, backend: str, ms: float) -> None: ...

    def set_cold(self, node: str, tier: str, nbytes: int, blocks: int) -> None: ...

    def count_tokens(self, backend: str, kind: str, n: int) -> None: ...


NullMetrics = Metrics


class RayMetrics(Metrics):
    def __init__(self) -> None:
        from ray.util import metrics

        self._resident = metrics.Gauge(
            "kvres_resident_tokens", "Resident KV tokens of a session", tag_keys=("backend", "session")
        )
        self._backend = metrics.Gauge(
            "kvres_backend_resident_tokens", "Resident KV tokens of a backend", tag_keys=("backend",)
        )
        self._cold_bytes = metrics.Gauge(
            "kvres_cold_bytes", "Bytes held by a cold-store tier", tag_keys=("node", "tier")
        )
        self._cold_blocks = metrics.Gauge(
            "kvres_cold_blocks", "Blocks held by a cold-store tier", tag_keys=("node", "tier")
        )
        self._counters: dict[str, Any] = {
            name: metrics.Counter(
                f"kvres_{name}_total", f"kvres {name.replace('_', ' ')}", tag_keys=("backend", "session")
            )
            for name in COUNTERS
        }
        self._plan = metrics.Histogram(
            "kvres_plan_latency_ms", "Planner latency per backend plan (ms)",
            boundaries=[0.1, 0.3, 1, 3, 10, 30, 100, 300, 1000], tag_keys=("backend",),
        )
        self._tokens = metrics.Counter(
            "kvres_tokens_total", "Tokens a backend prefilled (kind=prompt) or generated (kind=generated)",
            tag_keys=("backend", "kind"),
        )

    def set_resident(self, backend: str, session: str, tokens: int) -> None:
        self._resident.set(tokens, tags={"backend": backend, "session": session})

    def set_backend_resident(self, backend: str, tokens: int) -> None:
        self._backend.set(tokens, tags={"backend": backend})

    def count(self, name: str, backend: str, session: str, value: int = 1) -> None:
        if value:
            self._counters[name].inc(value, tags={"backend": backend, "session": session})

    def observe_plan_ms(self, backend: str, ms: float) -> None:
        self._plan.observe(ms, tags={"backend": backend})

    def set_cold(self, node: str, tier: str, nbytes: int, blocks: int) -> None:
        self._cold_bytes.set(nbytes, tags={"node": node, "tier": tier})
        self._cold_blocks.set(blocks, tags={"node": node, "tier": tier})

    def count_tokens(self, backend: str, kind: str, n: int) -> None:
        if n:
            self._tokens.inc(n, tags={"backend": backend, "kind": kind})
