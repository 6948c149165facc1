"""Next-token choice from logits.

Primitives:
- ``TokenSampler(temperature=0.0, seed=None)``: ``sample(logits) -> int``; greedy (argmax) at
  temperature 0, otherwise a draw from softmax(logits / temperature) using a numpy generator
  seeded with ``seed``, so the same seed gives the same tokens.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt


class TokenSampler:
    def __init__(self, temperature: float = 0.0, seed: int | None = None) -> None:
        if not np.isfinite(temperature) or temperature < 0:
            raise ValueError(f"temperature must be finite and >= 0, got {temperature}")
        self.temperature = float(temperature)
        self.seed = seed
        self._rng = np.random.default_rng(seed)

    def sample(self, logits: npt.NDArray[np.floating]) -> int:
        if self.temperature == 0.0:
            return int(np.argmax(logits))
        z = np.asarray(logits, dtype=np.float64) / self.temperature
        z -= z.max()
        p = np.exp(z)
        cdf = np.cumsum(p)
        # searchsorted on the CDF: one uniform draw per token, stable across numpy versions
        return int(min(np.searchsorted(cdf, self._rng.random() * cdf[-1], side="right"), len(cdf) - 1))
