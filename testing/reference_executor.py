"""The reference executor: the executor protocol in plain Python, no engine.

Primitives:
- ``ReferenceExecutor(vocab_size=64, capabilities=None)``: a fake model whose next-token logits
  are a deterministic function of the resident (token, relative position) pairs, so eviction,
  re-basing and import/export change or preserve them the way a real engine would. ``n_vocab`` is
  ``vocab_size``; ``truncate`` cuts the log and the positions as every executor does
  (``session_table.truncated_positions``) and returns the fake logits of what is left;
  ``fork_session`` is the contract's default (export and import every resident range). It has no
  end-of-generation tokens, no chat template and no control tokens (``special`` changes nothing).

It is the yardstick of the conformance suite: the same plan must leave the same resident ranges
on every executor.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from kvres.actors.engines.executor import Executor
from kvres.actors.engines.session_table import SessionTable, check_truncate_length, truncated_positions
from kvres.coldstore.block import KVBlock, KVGeometry, make_fingerprint
from kvres.policy.capabilities import Capabilities
from kvres.policy.errors import CapabilityError, RangeError, SessionExistsError
from kvres.policy.positions import PositionMap
from kvres.policy.ranges import Range
from kvres.policy.scoring import AttentionCapture
from kvres.policy.tokens import token_ids

REFERENCE_CAPABILITIES = Capabilities(
    remove_middle=True,
    position_shift=True,
    attention_capture=True,
    kv_export=True,
)
_GEOMETRY = KVGeometry(n_layers=1, n_kv_heads=1, head_dim=1)


@dataclass
class _Session:
    tokens: list[int] = field(default_factory=list)
    positions: PositionMap = field(default_factory=PositionMap)


class ReferenceExecutor(SessionTable[_Session], Executor):
    engine = "reference"

    def __init__(self, vocab_size: int = 64, capabilities: Capabilities | None = None) -> None:
        if vocab_size < 2:
            raise ValueError(f"vocab_size must be >= 2, got {vocab_size}")
        self.vocab_size = vocab_size
        self._caps = capabilities or REFERENCE_CAPABILITIES
        self._sessions: dict[str, _Session] = {}
        self.fingerprint = make_fingerprint(
            f"reference-v{vocab_size}", self.engine, "i32", "i32", _GEOMETRY
        )

    def capabilities(self) -> Capabilities:
        return self._caps

    def open_session(self, session_id: str, tokens: Sequence[int] = ()) -> None:
        if session_id in self._sessions:
            raise SessionExistsError(session_id)
        session = _Session(tokens=[int(t) for t in tokens])
        session.positions.extend_evicted(len(session.tokens))
        self._sessions[session_id] = session

    def close_session(self, session_id: str) -> None:
        self._get(session_id)
        del self._sessions[session_id]

    def _weights(self, s: _Session) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float64]]:
        """Resident tokens and the attention weight the last query gives each of them."""
        pos = s.positions.all_positions()
        mask = pos >= 0
        tokens = np.asarray(s.tokens, dtype=np.int64)[mask]
        dist = pos[mask].max() - pos[mask] if mask.any() else pos[mask]
        salient = 1.0 + 4.0 * (tokens % 7 == 0)
        return tokens, salient / (1.0 + dist)

    def append(self, session_id: str, tokens: Sequence[int]) -> npt.NDArray[np.float32]:
        s = self._get(session_id)
        toks = token_ids(tokens, self.vocab_size)
        if not toks:
            raise ValueError("append needs at least one token")
        s.positions.append(len(toks))
        s.tokens.extend(toks)
        return self._logits(s)

    def _logits(self, s: _Session) -> npt.NDArray[np.float32]:
        ids, weights = self._weights(s)
        logits = np.zeros(self.vocab_size, dtype=np.float64)
        np.add.at(logits, ids, weights)
        return logits.astype(np.float32)

    @property
    def n_vocab(self) -> int:
        return self.vocab_size

    def truncate(self, session_id: str, length: int) -> npt.NDArray[np.float32] | None:
        s = self._get(session_id)
        length = check_truncate_length(session_id, length, len(s.tokens))
        s.positions = truncated_positions(s.positions, length)
        del s.tokens[length:]
        if not s.tokens or not s.positions.resident_mask()[-1]:
            return None
        return self._logits(s)

    def evict_range(self, session_id: str, rng: Range, rebase: bool = False) -> None:
        s = self._get(session_id)
        if rebase and not self._caps.position_shift:
            raise CapabilityError("this executor cannot re-base positions (position_shift is false)")
        s.positions.evict(rng, rebase)

    def admit_range(self, session_id: str, rng: Range) -> None:
        self._get(session_id).positions.admit(rng)

    def export_range(self, session_id: str, rng: Range) -> KVBlock:
        s = self._get(session_id)
        positions = s.positions.positions(rng)
        token_ids = tuple(s.tokens[rng.start : rng.end])
        return KVBlock(
            fingerprint=self.fingerprint, model_id=f"reference-v{self.vocab_size}",
            engine=self.engine, type_k="i32", type_v="i32", geometry=_GEOMETRY,
            session_id=session_id, token_range=rng, token_ids=token_ids,
            payload=np.asarray(token_ids, dtype=np.int32).tobytes(),
            positions=tuple(int(p) for p in positions),
        )

    def import_range(self, session_id: str, block: KVBlock) -> None:
        s = self._get(session_id)
        block.check_fingerprint(self.fingerprint)
        rng = block.token_range
        s.positions.check_evicted(rng)
        self._check_block_tokens(session_id, block)
        offsets = np.asarray(block.positions, dtype=np.int64) - block.positions[0]
        s.positions.admit(rng, offsets, preferred_first=block.positions[0])

    def tokenize(self, text: str, add_bos: bool = True, special: bool = False) -> list[int]:
        """One id per character (its code point modulo the vocabulary); no BOS token exists."""
        return [ord(c) % self.vocab_size for c in text]

    def detokenize(self, tokens: Sequence[int], special: bool = False) -> str:
        return "".join(chr(t) for t in token_ids(tokens, self.vocab_size))

    def attention(self, session_id: str, window: int | None = None) -> AttentionCapture:
        """The fake model's attention: each of the last ``window`` resident rows spreads over the
        resident keys before it by salience / (1 + distance), normalised."""
        s = self._get(session_id)
        pos = s.positions.all_positions()
        keys = np.nonzero(pos >= 0)[0].astype(np.int64)
        if not keys.size:
            raise RangeError(f"session {session_id!r} has no resident tokens to score")
        rows = keys[-(window or 1):]
        tokens = np.asarray(s.tokens, dtype=np.int64)[keys]
        salient = 1.0 + 4.0 * (tokens % 7 == 0)
        dist = pos[rows][:, None] - pos[keys][None, :]
        weights = np.where(dist >= 0, salient[None, :] / (1.0 + np.maximum(dist, 0)), 0.0)
        probs = (weights / weights.sum(axis=1, keepdims=True)).astype(np.float32)[None, None]
        return AttentionCapture(probs, keys, rows)
