"""Prometheus's text exposition format, read as Prometheus would, for ``prometheus_check --scrape-only``.

Primitives:
- ``parse(text) -> list[Sample]``: every sample line (``name{label="value",...} number``) of a
  ``/metrics`` page; comments and blank lines skipped.
- ``evaluate(expr, samples) -> float | None``: the value of the PromQL subset the checks use:
  ``sum(NAME)``, ``sum(NAME{l="v",...})``, ``count(NAME)``, each optionally followed by
  ``or vector(0)``; None where no series matches (as Prometheus answers nothing). Anything else
  raises ``ValueError``.
- ``series_of(expr, samples) -> dict[str, int]``: per ``ray_kvres_*`` metric an expression reads,
  how many series the page has (what a panel's query can read; its rate or quantile needs a
  Prometheus).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

_LINE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s+(\S+)(\s+\d+)?$")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')
_EXPR = re.compile(r'^(sum|count)\(([a-zA-Z_:][a-zA-Z0-9_:]*)(\{([^}]*)\})?\)(\s+or\s+vector\((\d+)\))?$')
_METRIC = re.compile(r"\bray_kvres_[a-z_]+")


@dataclass(frozen=True)
class Sample:
    name: str
    labels: dict[str, str]
    value: float


def parse(text: str) -> list[Sample]:
    samples = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        m = _LINE.match(line)
        if m is None:
            continue
        labels = {k: v.encode().decode("unicode_escape") for k, v in _LABEL.findall(m.group(3) or "")}
        samples.append(Sample(m.group(1), labels, float(m.group(4))))
    return samples


def evaluate(expr: str, samples: list[Sample]) -> float | None:
    m = _EXPR.match(expr.strip())
    if m is None:
        raise ValueError(f"not in the subset a scrape can answer: {expr!r}")
    op, name, wanted = m.group(1), m.group(2), dict(_LABEL.findall(m.group(4) or ""))
    found = [s.value for s in samples if s.name == name and all(s.labels.get(k) == v for k, v in wanted.items())]
    if not found:
        return None if m.group(5) is None else float(m.group(6))
    value = float(len(found)) if op == "count" else math.fsum(found)
    return value


def series_of(expr: str, samples: list[Sample]) -> dict[str, int]:
    return {metric: sum(1 for s in samples if s.name == metric) for metric in sorted(set(_METRIC.findall(expr)))}
