"""What every probe shares: its error, the plausible range of a bandwidth, a line fit.

Primitives:
- ``ProbeError``: a probe that could not run or gave an impossible figure.
- ``check_plausible(what, gbps)``: a ``ProbeError`` naming ``what`` unless ``gbps`` lies in
  ``MIN_PLAUSIBLE_GBPS..MAX_PLAUSIBLE_GBPS``.
- ``fit_line(x, y) -> (intercept, slope)``: least squares of ``y = a + b x``.
- ``fit_cost(sizes, times) -> (fixed, seconds per unit)``: ``fit_line`` where the sizes differ, with
  a non-positive slope (noise swamped the size dependence) billed all as rate, no fixed part.

GB/s here is 1e9 bytes per second of payload moved (a memcpy of n bytes counts n, not 2n).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from kvres.policy.errors import KvresError

MIN_PLAUSIBLE_GBPS = 0.05
MAX_PLAUSIBLE_GBPS = 20_000.0  # above any real memory system: a figure past it means an elided copy


class ProbeError(KvresError, RuntimeError):
    """A probe could not run, or measured something impossible."""


def check_plausible(what: str, gbps: float) -> None:
    if not (MIN_PLAUSIBLE_GBPS <= gbps <= MAX_PLAUSIBLE_GBPS):
        raise ProbeError(
            f"{what} probe measured {gbps:.3g} GB/s, outside {MIN_PLAUSIBLE_GBPS}..{MAX_PLAUSIBLE_GBPS}"
        )


def fit_line(x: Sequence[float], y: Sequence[float]) -> tuple[float, float]:
    """Least-squares (intercept, slope) of y = a + b x."""
    xs, ys = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    slope, intercept = np.polyfit(xs, ys, 1)
    return float(intercept), float(slope)


def fit_cost(sizes: Sequence[int], times: Sequence[float]) -> tuple[float, float]:
    """(fixed s >= 0, s per unit > 0 unless every time is 0) of ``time = fixed + size * slope``."""
    fixed, slope = fit_line(sizes, times) if len(set(sizes)) >= 2 else (0.0, times[0] / sizes[0])
    if slope <= 0:  # noise swamped the size dependence: bill everything as rate
        fixed, slope = 0.0, max(t / s for t, s in zip(times, sizes, strict=True))
    return max(0.0, fixed), slope
