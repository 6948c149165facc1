"""Scorers: which keys a scored session keeps, as small frozen policy objects (the kvpress pattern).

Primitives:
- ``Scorer``: the base; ``name`` is what a ``SessionPolicy`` calls it; ``needs`` says what input
  it scores (``"attention"``: an ``AttentionCapture`` of the last queries; ``"keys"``: a
  ``KeyCapture`` of the resident keys); ``accumulates`` (it must see every row a session processes:
  H2O) and ``by_attention_window`` (it ranks by the last queries' attention: SnapKV, what a
  recall's scoring pass can use); ``score(capture) -> one float per key`` (higher = keep);
  ``block_scores(capture, ranges)``: summed per block, the planner's input.
- ``SnapKV(window=16, kernel=7, pool="max")``: attention the keys receive from the last ``window``
  queries (the observation window: the end of the prompt, e.g. the question), summed over layers,
  heads and rows, pooled so a hit's neighbours stay with it (Li et al. 2024).
- ``H2O()``: attention mass per key, summed over every query row of the capture (Zhang et al.
  2023: heavy hitters accumulate attention).
- ``KeyNorm()``: attention-free: keys with a small L2 norm draw the most attention, so a key's
  score is minus its norm, averaged over layers and KV heads (Devoto et al. 2024). Works with
  flash attention and on engines without an attention capture.
- ``KeyCapture(keys, key_positions)``: resident keys ``(n_layer, n_kv_head, n_key, head_dim)``.
- ``ScorerName``: the names a ``SessionPolicy.scorer`` may take; ``SCORERS``: name -> scorer class,
  the one table of them; ``scorer_for(name, window, kernel=7)``: the object a name stands for.

Everything here is pure numpy: the backends, the benchmarks and the tests call the same objects.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import ClassVar, Literal

import numpy as np
import numpy.typing as npt

from .ranges import Range
from .scoring import AttentionCapture, FloatArray, block_scores, key_mass, pool_1d

ScorerInput = Literal["attention", "keys"]
ScorerName = Literal["snapkv", "h2o", "keynorm"]  # the keys of SCORERS


@dataclass(frozen=True)
class KeyCapture:
    keys: npt.NDArray[np.float32]
    key_positions: npt.NDArray[np.int64]

    def __post_init__(self) -> None:
        if self.keys.ndim != 4 or self.keys.shape[2] != self.key_positions.shape[0]:
            raise ValueError(
                f"keys must be (n_layer, n_kv_head, n_key, head_dim) with one position per key; got "
                f"{self.keys.shape} and {self.key_positions.shape[0]} positions"
            )


Capture = AttentionCapture | KeyCapture


@dataclass(frozen=True)
class Scorer:
    needs: ClassVar[ScorerInput] = "attention"
    name: ClassVar[ScorerName]  # what a SessionPolicy calls it
    accumulates: ClassVar[bool] = False  # must see every row a session processes (H2O)
    by_attention_window: ClassVar[bool] = False  # ranks by the last queries' attention (SnapKV)

    @classmethod
    def with_window(cls, window: int, kernel: int) -> Scorer:
        """This scorer for a session whose observation window is ``window`` rows (only SnapKV
        reads it)."""
        return cls()

    def score(self, capture: Capture) -> FloatArray:
        raise NotImplementedError

    def positions(self, capture: Capture) -> npt.NDArray[np.int64]:
        return capture.key_positions

    def block_scores(self, capture: Capture, ranges: Sequence[Range]) -> list[float]:
        return [float(x) for x in block_scores(self.score(capture), self.positions(capture), ranges)]

    def _attention(self, capture: Capture) -> AttentionCapture:
        if not isinstance(capture, AttentionCapture):
            raise TypeError(f"{type(self).__name__} scores an attention capture, got {type(capture).__name__}")
        return capture


@dataclass(frozen=True)
class SnapKV(Scorer):
    name: ClassVar[ScorerName] = "snapkv"
    by_attention_window: ClassVar[bool] = True
    window: int = 16
    kernel: int = 7
    pool: Literal["max", "avg"] = "max"

    def __post_init__(self) -> None:
        if self.window < 1:
            raise ValueError(f"SnapKV window must be >= 1, got {self.window}")
        if self.kernel < 1 or self.kernel % 2 == 0:
            raise ValueError(f"SnapKV kernel must be odd and >= 1, got {self.kernel}")

    @classmethod
    def with_window(cls, window: int, kernel: int) -> Scorer:
        return cls(window, kernel)

    def score(self, capture: Capture) -> FloatArray:
        probs = self._attention(capture).probs
        return pool_1d(key_mass(probs[..., -self.window :, :]), self.kernel, self.pool)


@dataclass(frozen=True)
class H2O(Scorer):
    name: ClassVar[ScorerName] = "h2o"
    accumulates: ClassVar[bool] = True

    def score(self, capture: Capture) -> FloatArray:
        return key_mass(self._attention(capture).probs)


@dataclass(frozen=True)
class KeyNorm(Scorer):
    needs: ClassVar[ScorerInput] = "keys"
    name: ClassVar[ScorerName] = "keynorm"

    def score(self, capture: Capture) -> FloatArray:
        if not isinstance(capture, KeyCapture):
            raise TypeError(f"KeyNorm scores a key capture, got {type(capture).__name__}")
        norms = np.linalg.norm(capture.keys.astype(np.float64), axis=-1)  # (layer, head, key)
        out: FloatArray = -norms.mean(axis=(0, 1))
        return out


SCORERS: Mapping[str, type[Scorer]] = {cls.name: cls for cls in (SnapKV, H2O, KeyNorm)}


def scorer_for(name: str, window: int, kernel: int = 7) -> Scorer:
    scorer = SCORERS.get(name)
    if scorer is None:
        raise ValueError(f"unknown scorer {name!r}; known: {', '.join(SCORERS)}")
    return scorer.with_window(window, kernel)
