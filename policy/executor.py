"""The executor protocol: the one seam every engine implements.

Primitives:
- ``Executor``: ``capabilities``, ``open_session`` (optionally with a token log whose KV is not
  resident: a restored session, filled by ``import_range`` / ``admit_range``), ``append``, ``token_log``, ``resident_ranges``,
  ``evict_range``, ``admit_range``, ``export_range``, ``import_range``,
  ``block_attention_scores``, ``close_session``.
- ``apply_plan(executor, session_id, plan, spill)``: carry a ``Plan`` out on an executor
  (exporting evicted blocks first when ``spill`` is given), returning the exported blocks.

Positions. Every range in this protocol is in *token-log* positions: index i is the i-th token the
session ever received. The engine keeps its own cache position per resident token; eviction with
``rebase=True`` closes the gap (later tokens move down), ``rebase=False`` leaves it. Admitting or
importing a range ``[a, b)`` places it at cache position ``p(prev) + (a - prev)`` after the
nearest resident token ``prev`` before it (or keeps the original distance to the next resident
token when there is none before), shifting the resident tail up first when it is in the way.
An imported block goes back to its original positions (``KVBlock.positions``) when they lie after
the previous resident token, so suspend + resume restores the exact layout.

Errors: an unknown session id raises ``UnknownSessionError``; a range outside the token log, or
not fully resident (evict, export) / not fully evicted (admit, import), raises ``RangeError``;
an operation the capabilities deny raises ``CapabilityError``. None of them changes the session.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

from .capabilities import Capabilities
from .planner import Plan
from .ranges import Range


@runtime_checkable
class Executor(Protocol):
    def capabilities(self) -> Capabilities: ...

    def open_session(self, session_id: str, tokens: Sequence[int] = ()) -> None:
        """Open a session; ``tokens`` become its token log with no KV resident yet."""
        ...

    def append(self, session_id: str, tokens: Sequence[int]) -> npt.NDArray[np.float32]:
        """Add tokens to the session (batched prefill); return next-token logits (float32)."""
        ...

    def token_log(self, session_id: str) -> list[int]: ...

    def resident_ranges(self, session_id: str) -> list[Range]: ...

    def evict_range(self, session_id: str, rng: Range, rebase: bool = False) -> None: ...

    def admit_range(self, session_id: str, rng: Range) -> None:
        """Recompute an evicted range from the token log and make it resident again."""
        ...

    def export_range(self, session_id: str, rng: Range) -> Any:
        """A ``kvres.coldstore.KVBlock`` holding the KV of a resident range."""
        ...

    def import_range(self, session_id: str, block: Any) -> None: ...

    def block_attention_scores(
        self, session_id: str, ranges: Sequence[Range], window: int | None = None
    ) -> list[float]:
        """One score per range: attention the range's keys receive from the last ``window``
        resident tokens (the engine's default observation window when None)."""
        ...

    def close_session(self, session_id: str) -> None: ...


def apply_plan(
    executor: Executor,
    session_id: str,
    plan: Plan,
    spill: Callable[[Any], None] | None = None,
) -> list[Range]:
    """Evict ``plan.evict_cold`` from the session, last range first so earlier positions stay put.

    With ``spill``, each range is exported and handed to it before it is evicted, so no KV is
    dropped before its copy is safe. Returns the evicted ranges in position order.
    """
    evicted = sorted(b.range for b in plan.evict_cold)
    for rng in reversed(evicted):
        if spill is not None:
            spill(executor.export_range(session_id, rng))
        executor.evict_range(session_id, rng, rebase=plan.rebase_positions)
    return evicted
