"""State slicing: the OpenVINO executor that edits the KV states themselves.

Primitives:
- ``StateExecutor(model_path, **options)`` (``mode = "state"``; options as ``OpenVINOExecutor``):
  the sync slices the KV states by name and re-bases the kept keys by a numpy RoPE rotation
  (``rope.rotate_keys``), each by how far it moved: one slice and one rotation for a whole plan.
  Admitting recomputes only the admitted tokens over the resident prefix before them and splices
  them in, the tail keeping its KV (rotated if it had to move up); importing splices the block's KV
  in, rotated to its place. Eviction makes no engine call. ``position_shift`` needs the RoPE
  parameters of the model (a converted GGUF records them).
"""

from __future__ import annotations

import numpy as np

from kvres.coldstore.block import KVBlock
from kvres.policy.positions import AdmitOp, PositionMap
from kvres.policy.ranges import Range

from .executor import OpenVINOExecutor, RecomputeError, Session
from .states import KVArrays, concat, read_kv, take


class StateExecutor(OpenVINOExecutor):
    mode = "state"

    def _can_rebase(self) -> bool:
        return self.loaded.rope is not None

    def _apply_pending(self, session_id: str, s: Session) -> None:
        held = s.held
        entries = np.nonzero(held.resident_mask())[0]  # log index of each held entry
        keep = s.positions.resident_mask()[entries]
        if keep.sum() != s.positions.resident_count:
            raise RuntimeError("state mode has admissions pending; they are never deferred")
        kept = entries[keep]
        moved = s.positions.all_positions()[kept] - held.all_positions()[kept]
        kv = [(k[:, :, keep], v[:, :, keep]) for k, v in self._kv(s)]
        self._set_kv(s, self._rotate(kv, moved))
        s.kv_map = None

    def admit_range(self, session_id: str, rng: Range) -> None:
        s = self._get(session_id)
        new_map = s.positions.copy()
        op = new_map.admit(rng)
        self.sync(session_id)
        kv = self._kv(s)
        idx = self._index(s.positions, rng.start)
        head, tail = take(kv, 0, idx), self._rotate(take(kv, idx), op.tail_shift)
        try:
            self._set_kv(s, head)
            self._run(s, s.tokens[rng.start:rng.end], list(op.positions), idx)
            fresh = take(read_kv(s.request, self.loaded.state_names, self.loaded.geometry), idx)
            self._set_kv(s, concat(head, fresh, tail))
        except Exception as exc:
            self._set_kv(s, kv)
            raise RecomputeError(f"recomputing {rng} of session {session_id!r} failed: {exc}") from exc
        s.positions = new_map

    def _place_block(
        self, session_id: str, s: Session, block: KVBlock, part: KVArrays, new_map: PositionMap, op: AdmitOp
    ) -> None:
        self.sync(session_id)
        kv = self._kv(s)
        idx = self._index(s.positions, block.token_range.start)
        head, tail = take(kv, 0, idx), self._rotate(take(kv, idx), op.tail_shift)
        part = self._rotate(part, op.positions[0] - block.positions[0])
        self._set_kv(s, concat(head, part, tail))
        s.positions = new_map
