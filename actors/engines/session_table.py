"""The session bookkeeping every executor shares.

Primitives:
- ``SessionTable[S]``: a base class over ``self._sessions`` (session id -> an ``S``, an object with
  ``tokens`` and ``positions``, a ``kvres.policy.positions.PositionMap``): ``_get`` (raises
  ``UnknownSessionError``), ``sessions``, ``token_log``, ``resident_ranges``, ``cache_positions``,
  ``_check_block`` (a ``KVBlock`` of this engine's fingerprint carrying the token ids the session
  has at its range).
"""

from __future__ import annotations

from typing import Generic, Protocol, TypeVar

import numpy as np
import numpy.typing as npt

from kvres.coldstore.block import KVBlock
from kvres.policy.errors import BlockMismatchError, UnknownSessionError
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
