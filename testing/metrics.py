"""Comparisons of engine outputs for tests and benchmarks.

Primitives:
- ``log_softmax(logits)``: float64 log-probabilities of a logit vector.
- ``kl_divergence(p_logits, q_logits)``: KL(p || q) in nats between their softmax distributions.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt


def log_softmax(logits: npt.ArrayLike) -> npt.NDArray[np.float64]:
    x = np.asarray(logits, dtype=np.float64)
    m = x.max()
    out: npt.NDArray[np.float64] = x - (m + np.log(np.exp(x - m).sum()))
    return out


def kl_divergence(p_logits: npt.ArrayLike, q_logits: npt.ArrayLike) -> float:
    lp, lq = log_softmax(p_logits), log_softmax(q_logits)
    return float((np.exp(lp) * (lp - lq)).sum())
