"""Re-prefill: the OpenVINO executor that rebuilds the KV states from the token log.

Primitives:
- ``RecomputeExecutor(model_path, **options)`` (``mode = "recompute"``; options as
  ``OpenVINOExecutor``): the seed design, what a KV-opaque engine allows. Evicting drops the range
  (the token log is the source of truth; whoever wants its KV back exports it first, as the
  backend host does when a session spills); admitting and importing (after the block is checked)
  mark the range resident. The sync then rebuilds the cache by re-prefilling every resident token at
  its position, so any residency is reachable: remove_middle and position_shift always hold.
"""

from __future__ import annotations

import numpy as np

from kvres.coldstore.block import KVBlock
from kvres.policy.positions import AdmitOp, PositionMap
from kvres.policy.ranges import Range

from .base_executor import OpenVINOExecutor, RecomputeError, Session
from .states import KVArrays


class RecomputeExecutor(OpenVINOExecutor):
    mode = "recompute"

    def _can_rebase(self) -> bool:
        return True

    def _apply_pending(self, session_id: str, s: Session) -> None:
        before = self._kv(s)
        mask = s.positions.resident_mask()
        tokens = np.asarray(s.tokens, dtype=np.int64)[mask]
        positions = s.positions.all_positions()[mask]
        try:
            s.request.reset_state()
            if tokens.size:
                self._run(s, tokens.tolist(), positions.tolist(), 0)
        except Exception as exc:
            self._set_kv(s, before)
            raise RecomputeError(
                f"re-prefilling {tokens.size} tokens of session {session_id!r} failed: {exc}"
            ) from exc
        s.kv_map = None

    def admit_range(self, session_id: str, rng: Range) -> None:
        s = self._get(session_id)
        new_map = s.positions.copy()
        new_map.admit(rng)
        self._defer(s, new_map)

    def _place_block(
        self, session_id: str, s: Session, block: KVBlock, part: KVArrays, new_map: PositionMap, op: AdmitOp
    ) -> None:
        self._defer(s, new_map)
