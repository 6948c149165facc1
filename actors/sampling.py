"""Next-token sampling from logits.

Primitives:
- ``sample_token(logits, temperature, rng) -> int``: greedy (argmax) at temperature 0, otherwise
  a draw from softmax(logits / temperature) with the given numpy Generator.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt


def sample_token(
    logits: npt.NDArray[np.float32], temperature: float = 0.0, rng: np.random.Generator | None = None
) -> int:
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    if temperature == 0:
        return int(np.argmax(logits))
    if rng is None:
        raise ValueError("sampling at temperature > 0 needs a seeded numpy Generator")
    z = logits.astype(np.float64) / temperature
    p = np.exp(z - z.max())
    return int(rng.choice(p.shape[0], p=p / p.sum()))
