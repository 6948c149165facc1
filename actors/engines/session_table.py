"""The session bookkeeping every executor shares.

Primitives:
- ``SessionTable[S]``: a base class over ``self._sessions`` (session id -> an ``S``, an object with
  ``tokens`` and ``positions``, a ``kvres.policy.positions.PositionMap``): ``_get`` (raises
  ``UnknownSessionError``), ``sessions``, ``token_log``, ``resident_ranges``, ``cache_positions``,
  ``_check_block`` (a ``KVBlock`` of this engine's fingerprint carrying the token ids the session
  has at its range).
- ``check_truncate_length(session_id, length, log_length) -> int``: ``length`` as an int in
  ``[0, log_length]``, else ``RangeError`` naming it.
- ``truncated_positions(positions, length) -> PositionMap``: the map of the log's first ``length``
  tokens: their residency and positions as they are, and the next position where the first dropped
  token's place says it was (the position of the first dropped resident token, less the dropped
  tokens before it), never at or below a kept position. Appending after it places tokens where a
  session that never had the dropped ones would.
"""

from __future__ import annotations

from typing import Generic, Protocol, TypeVar

import numpy as np
import numpy.typing as npt

from kvres.coldstore.block import KVBlock
from kvres.policy.errors import BlockMismatchError, RangeError, UnknownSessionError
from kvres.policy.positions import PositionMap
from kvres.policy.ranges import Range


class LoggedSession(Protocol):
    tokens: list[int]
    positions: PositionMap


S = TypeVar("S", bound=LoggedSession)


class SessionTable(Generic[S]):
    _sessions: dict[str, S]

    def _get(self, session_id: str) -> S:
        try:
            return self._sessions[session_id]
        except KeyError:
            raise UnknownSessionError(session_id) from None

    def sessions(self) -> list[str]:
        return list(self._sessions)

    def token_log(self, session_id: str) -> list[int]:
        return list(self._get(session_id).tokens)

    def resident_ranges(self, session_id: str) -> list[Range]:
        return list(self._get(session_id).positions.resident_ranges())

    def cache_positions(self, session_id: str) -> npt.NDArray[np.int64]:
        """Engine cache position per token-log index; -1 where evicted."""
        return np.asarray(self._get(session_id).positions.all_positions())

    def _check_block(self, session_id: str, block: object, fingerprint: str) -> KVBlock:
        """``block`` as a ``KVBlock`` of this engine (``fingerprint``) whose token ids match the
        session's at its range, or ``BlockMismatchError``."""
        if not isinstance(block, KVBlock):
            raise BlockMismatchError(f"expected a KVBlock, got {type(block).__name__} {block!r:.80}")
        block.check_fingerprint(fingerprint)
        self._check_block_tokens(session_id, block)
        return block

    def _check_block_tokens(self, session_id: str, block: KVBlock) -> None:
        rng = block.token_range
        if list(block.token_ids) != self._get(session_id).tokens[rng.start : rng.end]:
            raise BlockMismatchError(
                f"block for {rng} carries other token ids than session {session_id!r} has there"
            )


def check_truncate_length(session_id: str, length: object, log_length: int) -> int:
    if isinstance(length, bool) or not isinstance(length, (int, np.integer)) or not 0 <= length <= log_length:
        raise RangeError(f"truncate length={length!r} is outside [0, {log_length}], the log of session {session_id!r}")
    return int(length)


def truncated_positions(positions: PositionMap, length: int) -> PositionMap:
    mask = positions.resident_mask()
    pos = positions.all_positions()
    dropped = np.nonzero(mask[length:])[0]
    if dropped.size:
        next_pos = int(pos[length + dropped[0]]) - int(dropped[0])
    else:
        next_pos = positions.next_pos - (positions.length - length)
    kept = pos[:length][mask[:length]]
    if kept.size:
        next_pos = max(next_pos, int(kept[-1]) + 1)
    out = PositionMap()
    out.extend_evicted(length)
    out.relayout(mask[:length], np.maximum(pos[:length], 0), max(next_pos, 0))
    return out
