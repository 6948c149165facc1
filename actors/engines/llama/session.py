"""A llama executor's session: its token log, its positions and what waits to enter the engine.

Primitives:
- ``Session(seq)``: ``seq`` (its llama sequence id), ``tokens`` (the token log), ``positions``
  (a ``kvres.policy.positions.PositionMap``), ``logits`` (the next-token logits of the current
  cache; None after a change), ``pending`` (imports not restored yet) and ``prefill`` (the next
  turn, decoded by a recall's scoring pass). ``appended(tokens, logits) -> logits`` records
  tokens placed after the last position (and returns a copy of their logits).
- ``PendingImport(block, rng, positions, delta)``: an import checked and placed in the map, its
  cells restored at the session's next engine operation.
- ``Prefill(tokens, cells, logits, positions)``: a turn decoded by a recall's scoring pass.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from kvres.coldstore.block import KVBlock
from kvres.policy.positions import PositionMap
from kvres.policy.ranges import Range

from .state_blob import StateCells


@dataclass(frozen=True)
class PendingImport:
    block: KVBlock
    rng: Range
    positions: tuple[int, ...]  # where the map placed it
    delta: int  # target position - exported position


@dataclass(frozen=True)
class Prefill:
    """A turn decoded by a recall's scoring pass (over the resident cells and every cold block):
    its cells (at the scoring pass's positions) and last logits. The session's next append takes
    them instead of decoding the same tokens again, if it is exactly these tokens and the session
    still holds ``positions`` (what the exchange after the scoring pass left)."""

    tokens: tuple[int, ...]
    cells: StateCells
    logits: npt.NDArray[np.float32]
    positions: npt.NDArray[np.int64]


@dataclass
class Session:
    seq: int
    tokens: list[int] = field(default_factory=list)
    positions: PositionMap = field(default_factory=PositionMap)
    logits: npt.NDArray[np.float32] | None = None  # next-token logits of the current cache
    pending: list[PendingImport] = field(default_factory=list)  # imports not yet in the engine
    prefill: Prefill | None = None  # the next turn, decoded by a recall's scoring pass

    def appended(self, tokens: list[int], logits: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
        self.positions.append(len(tokens))
        self.tokens.extend(tokens)
        self.logits = logits
        return logits.copy()
