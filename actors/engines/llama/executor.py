"""The llama.cpp executor: the executor contract on llama-cpp-python's low-level API.

Primitives:
- ``LlamaExecutor(model_path, n_ctx=4096, n_seq_max=8, type_k="f16", type_v="f16",
  n_threads=None, n_batch=512, flash_attn=None, score_window=32, score_kernel=7,
  n_gpu_layers=None, main_gpu=None)`` (layers offloaded and main device; None: llama.cpp's default), an
  ``kvres.actors.engines.executor.Executor``: ``capabilities``, ``open_session(session_id, tokens=())``,
  ``append``, ``token_log``, ``resident_ranges``, ``evict_range``, ``admit_range``,
  ``export_range``, ``import_range``, ``attention`` (raw capture), ``keys``, ``recall_attention``,
  ``exchange``, ``tokenize``, ``detokenize``, ``close_session``.
  Beyond it: ``generate``, ``stream``, ``kv_profile``, ``cache_positions``, ``sessions``,
  ``free_cells``, ``flush``, ``close``, ``claim_decode_threads`` / ``reserve_decode_threads``
  (which thread decodes with ``n_threads``, see ``engine``); attributes ``fingerprint``, ``model_id``
  (``kvres.actors.model_files.model_id``), ``geometry``, ``n_ctx``, ``n_seq_max``, ``type_k``,
  ``type_v``, ``flash_attn``, ``n_vocab``.

One engine context serves every session: unified KV, sequence id i per session (plus its
parking sequence and one shared scratch sequence, see ``cache_ops``). ``n_ctx`` is the token
budget of all sessions together; ``n_seq_max`` the number of sessions. Ranges are token-log
positions and ``kvres.policy.positions.PositionMap`` decides every cache position, so this
executor places tokens exactly where every other executor would.

Mechanism (docs/architecture.md, llama.cpp; the cell-level steps live in ``cache_ops``):
- evict: ``seq_rm`` of the range's cache positions, then with re-basing ``seq_add`` of the tail
  (llama.cpp applies the RoPE K-shift on the next decode).
- export: share the range's cells with the scratch sequence (``seq_cp``) and serialise it
  (``llama_state_seq_get_data``), after applying any pending K-shift.
- import: checked at once (fingerprint, token ids, payload size and cell positions), restored
  at the session's next engine operation, all pending imports in position order: the blob goes
  into the scratch sequence at its exported positions, moves to the positions the map chose,
  and is shared into the session. An import that needs the tail moved is restored at once.
- append / admit: decoded in place when they continue the sequence, otherwise staged in the
  scratch sequence (llama.cpp decodes only at a sequence's last position + 1).
- attention scores: a second context with flash attention off (``attention.ScoringContext``),
  created on first use; the serving context keeps flash attention.
- recall (``recall_attention``, ``exchange``): the session's cells and the cold blocks' are read
  as arrays (``state_blob.StateCells``), merged in log order, moved to their positions in numpy
  (``rope.KeyRotation``, f16 through ggml's converters in ``halfs``) and restored in one state
  write: into the scoring context (V transposed) to decode the new turn there with attention
  capture, and into the session for the exchange. The turn's cells and logits from the scoring
  pass are kept (``_Prefill``) and taken by the next append of exactly those tokens.

Exactness: the same cells in the same order give bit-identical logits (export / evict / import,
suspend / resume). With flash attention llama.cpp's CPU kernel rounds in KV-cell order, so a
different physical layout (another session's cells interleaved, a batch split differently)
changes logits at the 1e-4..1e-3 level; ``cache_ops`` keeps each session's cells in position
order so that re-imports land where they were.

Sliding-window models (``n_swa > 0``) keep a second cache: ``kv_export`` is false for them.

KV precision: ``type_k`` / ``type_v`` in ``kvres.policy.kv_types.CONFIGURABLE_KV_TYPES`` (a
quantized type needs a head dimension of whole blocks; a quantized V cache turns flash attention
on). A quantized K cache cannot be shifted (llama.cpp 0.3.36 crashes applying the K-shift to
it): ``position_shift`` is then false and operations that would move cells raise
``CapabilityError``.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from kvres.actors.engines.executor import RECALL_PREP_BYTES, Executor, check_block_token_ids
from kvres.actors.engines.session_table import SessionTable
from kvres.actors.host.sampling import TokenSampler
from kvres.actors.model_files import model_id, profile_from_gguf, read_gguf_metadata
from kvres.coldstore.block import KVBlock, KVGeometry, make_fingerprint
from kvres.policy.capabilities import Capabilities
from kvres.policy.capacity import LayerKVProfile
from kvres.policy.errors import (
    BlockMismatchError,
    CapabilityError,
    RangeError,
    SessionExistsError,
)
from kvres.policy.kv_types import (
    CONFIGURABLE_KV_TYPES,
    QUANTIZED_KV_TYPES,
    kv_type_fits_head,
    kv_type_info,
    kv_type_row_bytes,
)
from kvres.policy.positions import PositionMap
from kvres.policy.ranges import Range
from kvres.policy.recall import BlockSpans, exchange_layout
from kvres.policy.scorers import KeyCapture
from kvres.policy.scoring import AttentionCapture
from kvres.policy.tokens import token_ids

from .attention import ScoringContext
from .cache_ops import CacheOps
from .engine import LlamaContext, LlamaModel, claim_decode_threads, reserve_decode_threads
from .errors import ContextFullError, EngineError, SessionLimitError
from .halfs import f16_to_f32, f32_to_f16
from .quant_rows import DEQUANTIZABLE, dequantize_rows
from .rope import KeyRotation, key_rotation
from .state_blob import StateCells, expected_payload_size, parse_cells, read_cell_positions, read_keys

MIN_N_CTX = 32
MAX_SEQUENCES = 256  # LLAMA_MAX_SEQ, including the reserved sequences
ENGINE = "llama.cpp"
_RESERVED_CELLS = 2  # applying pending K-shifts decodes one throwaway token
_RESERVED_SEQS = 1  # scratch; each session also has a parking sequence (see cache_ops)
_FLOAT_DTYPES: dict[str, np.dtype[Any]] = {"f16": np.dtype("<f2"), "f32": np.dtype("<f4")}


@dataclass(frozen=True)
class _PendingImport:
    block: KVBlock
    rng: Range
    positions: tuple[int, ...]  # where the map placed it
    delta: int  # target position - exported position


@dataclass(frozen=True)
class _Prefill:
    """A turn decoded by a recall's scoring pass (over the resident cells and every cold block):
    its cells (at the scoring pass's positions) and last logits. The session's next append takes
    them instead of decoding the same tokens again, if it is exactly these tokens and the session
    still holds ``positions`` (what the exchange after the scoring pass left)."""

    tokens: tuple[int, ...]
    cells: StateCells
    logits: npt.NDArray[np.float32]
    positions: npt.NDArray[np.int64]


@dataclass(frozen=True)
class _RecallMemo:
    """What ``recall_attention`` read, for the ``exchange`` that follows it (valid while the
    session's positions are unchanged): its resident cells, and those merged with the blocks'
    cells in log order at the positions they were stored at."""

    session_id: str
    positions: npt.NDArray[np.int64]
    old: tuple[StateCells, npt.NDArray[np.int64]]
    cells: StateCells
    index: npt.NDArray[np.int64]
    blocks: frozenset[int]  # ids of the blocks merged in


@dataclass(frozen=True)
class _RecallPrep:
    """What ``recall_attention`` computes before it decodes the turn (``prepare_recall``, done
    while the backend is idle): valid while the session holds ``memo.positions`` with nothing
    pending, for these very blocks and ``rebase``."""

    blocks: tuple[KVBlock, ...]
    rebase: bool
    memo: _RecallMemo
    blob: bytes  # the scoring context's state: resident and block cells at their recall positions
    n_cells: int
    first: int  # the turn's first position there

    @property
    def nbytes(self) -> int:
        old, merged = self.memo.old[0], self.memo.cells
        return old.k.nbytes + old.v.nbytes + merged.k.nbytes + merged.v.nbytes + len(self.blob)

    def holds(self, s: _Session, blocks: Sequence[KVBlock], rebase: bool) -> bool:
        return (rebase == self.rebase and not s.pending and len(blocks) == len(self.blocks)
                and all(a is b for a, b in zip(blocks, self.blocks, strict=True))
                and np.array_equal(self.memo.positions, s.positions.all_positions()))


@dataclass
class _Session:
    seq: int
    tokens: list[int] = field(default_factory=list)
    positions: PositionMap = field(default_factory=PositionMap)
    logits: npt.NDArray[np.float32] | None = None  # next-token logits of the current cache
    pending: list[_PendingImport] = field(default_factory=list)  # imports not yet in the engine
    prefill: _Prefill | None = None  # the next turn, decoded by a recall's scoring pass


def _check_n_ctx(n_ctx: Any) -> int:
    if isinstance(n_ctx, bool) or not isinstance(n_ctx, (int, np.integer)):
        raise ValueError(f"n_ctx must be an int, got {n_ctx!r}")
    if n_ctx < MIN_N_CTX:
        raise ValueError(f"n_ctx={n_ctx} is too small; it must be at least {MIN_N_CTX}")
    if n_ctx % 2:
        raise ValueError(f"n_ctx={n_ctx} is odd; llama.cpp needs an even context size")
    return int(n_ctx)


class LlamaExecutor(SessionTable, Executor):
    engine = ENGINE

    def __init__(
        self,
        model_path: str | os.PathLike[str],
        n_ctx: int = 4096,
        n_seq_max: int = 8,
        type_k: str = "f16",
        type_v: str = "f16",
        n_threads: int | None = None,
        n_batch: int = 512,
        flash_attn: bool | None = None,
        score_window: int = 32,
        score_kernel: int = 7,
        n_gpu_layers: int | None = None,
        main_gpu: int | None = None,
    ) -> None:
        self.n_ctx = _check_n_ctx(n_ctx)
        max_sessions = (MAX_SEQUENCES - _RESERVED_SEQS) // 2
        if not 1 <= int(n_seq_max) <= max_sessions:
            raise ValueError(f"n_seq_max={n_seq_max} must be in [1, {max_sessions}]")
        for name, kv_type in (("type_k", type_k), ("type_v", type_v)):
            if kv_type not in CONFIGURABLE_KV_TYPES:
                raise ValueError(f"{name}={kv_type!r} is not a supported KV type "
                                 f"({', '.join(CONFIGURABLE_KV_TYPES)})")
        if type_v in QUANTIZED_KV_TYPES:
            if flash_attn is False:
                raise ValueError(f"type_v={type_v!r} needs flash attention; flash_attn=False was given")
            flash_attn = True
        if n_batch < 1:
            raise ValueError(f"n_batch={n_batch} must be >= 1")
        if score_window < 1 or score_kernel < 1 or score_kernel % 2 == 0:
            raise ValueError(f"score_window={score_window} must be >= 1 and score_kernel="
                             f"{score_kernel} odd and >= 1")
        self.n_seq_max = int(n_seq_max)
        self.type_k, self.type_v = type_k, type_v
        self.flash_attn = True if flash_attn is None else bool(flash_attn)
        self.n_threads = int(n_threads) if n_threads else max(1, min(4, os.cpu_count() or 1))
        self.n_batch = int(n_batch)
        self.score_window, self.score_kernel = int(score_window), int(score_kernel)
        self.model_path = Path(model_path)

        self._model = LlamaModel(model_path, n_gpu_layers=n_gpu_layers, main_gpu=main_gpu)
        self._scoring: ScoringContext | None = None
        self._recall_memo: _RecallMemo | None = None
        self._recall_preps: OrderedDict[str, _RecallPrep] = OrderedDict()  # newest last
        try:
            self.geometry = self._geometry()
            self._check_quantizable()
            self._ctx = LlamaContext(
                self._model, n_ctx=self.n_ctx + _RESERVED_CELLS,
                n_seq_max=2 * self.n_seq_max + _RESERVED_SEQS,
                type_k=type_k, type_v=type_v, flash_attn=self.flash_attn, n_batch=self.n_batch,
                n_threads=self.n_threads,
            )
        except BaseException:
            self._model.close()
            raise
        filler = self._model.bos if self._model.bos >= 0 else 0
        # llama.cpp reports can_shift for quantized K caches, but applying the K-shift crashes
        can_shift = self._ctx.can_shift and type_k not in QUANTIZED_KV_TYPES
        self._ops = CacheOps(self._ctx, self.n_seq_max, filler, can_shift)
        self._free_seqs = list(range(self.n_seq_max - 1, -1, -1))
        self._sessions: dict[str, _Session] = {}
        self._lock = threading.RLock()

        self.model_id = model_id(self.model_path)
        row = self.geometry.n_kv_heads * self.geometry.head_dim
        self._k_row = int(kv_type_row_bytes(type_k, row))
        self._v_row = int(kv_type_row_bytes(type_v, row))
        # V rows are stored transposed without flash attention: another payload layout.
        self.payload_format = f"llama-state-seq/{'v-rows' if self.flash_attn else 'v-trans'}"
        self.fingerprint = make_fingerprint(
            self.model_id, f"{ENGINE}:{self.payload_format}", type_k, type_v, self.geometry
        )
        self._caps = Capabilities(
            remove_middle=True,
            position_shift=self._ops.can_shift,
            attention_capture=True,
            key_access=type_k in ("f32", "f16") and self._model.n_swa == 0,
            # a sliding-window model keeps two caches, whose state blob this backend does not parse
            kv_export=self._model.n_swa == 0,
        )

    def _check_quantizable(self) -> None:
        for name, kv_type in (("type_k", self.type_k), ("type_v", self.type_v)):
            if not kv_type_fits_head(kv_type, self.geometry.head_dim):
                raise ValueError(
                    f"{name}={kv_type!r} needs a head dimension divisible by "
                    f"{kv_type_info(kv_type).block_elements}; {self.model_path.name} has head_dim "
                    f"{self.geometry.head_dim}"
                )

    def _geometry(self) -> KVGeometry:
        meta = read_gguf_metadata(self.model_path)
        arch = meta.get("general.architecture")
        head_dim = meta.get(f"{arch}.attention.key_length") or self._model.n_embd // self._model.n_head
        return KVGeometry(self._model.n_layer, self._model.n_head_kv, int(head_dim))

    # -- lifecycle ------------------------------------------------------------------------
    def close(self) -> None:
        """Free the engine contexts and the model; the executor is unusable afterwards."""
        if self._scoring is not None:
            self._scoring.close()
            self._scoring = None
        if getattr(self, "_ctx", None) is not None:
            self._ctx.close()
        self._model.close()
        self._sessions = {}

    @staticmethod
    def claim_decode_threads() -> None:
        """The calling thread's decodes use ``n_threads`` (``engine.claim_decode_threads``)."""
        claim_decode_threads()

    @staticmethod
    def reserve_decode_threads() -> None:
        reserve_decode_threads()

    def __enter__(self) -> LlamaExecutor:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        # interpreter shutdown may already have torn llama_cpp down
        with contextlib.suppress(Exception):
            self.close()

    # -- small queries --------------------------------------------------------------------
    def capabilities(self) -> Capabilities:
        return self._caps

    def kv_profile(self) -> LayerKVProfile:
        return profile_from_gguf(self.model_path, self.type_k, self.type_v)

    def tokenize(self, text: str, add_bos: bool = True) -> list[int]:
        return self._model.tokenize(text, add_bos=add_bos)

    def detokenize(self, tokens: Sequence[int]) -> str:
        return self._model.detokenize(tokens)

    @property
    def n_vocab(self) -> int:
        return self._model.n_vocab

    def free_cells(self) -> int:
        """KV cells not held by any session's resident tokens."""
        used = sum(s.positions.resident_count for s in self._sessions.values())
        return self.n_ctx - used

    def _ensure_room(self, n: int) -> None:
        free = self.free_cells()
        if n > free:
            raise ContextFullError(
                f"the context has {free} free KV cells of n_ctx={self.n_ctx}; {n} are needed",
                needed=n, free=free,
            )

    # -- sessions -------------------------------------------------------------------------
    def open_session(self, session_id: str, tokens: Sequence[int] = ()) -> None:
        """Open a session; ``tokens`` become its token log with no KV resident (a restored
        session, filled back by ``import_range`` / ``admit_range``)."""
        with self._lock:
            if session_id in self._sessions:
                raise SessionExistsError(session_id)
            log = self._check_tokens(tokens) if len(tokens) else []
            if not self._free_seqs:
                raise SessionLimitError(
                    f"cannot open session {session_id!r}: all n_seq_max={self.n_seq_max} "
                    "sequences of the context are in use"
                )
            seq = self._free_seqs.pop()
            session = _Session(seq, tokens=log)
            session.positions.extend_evicted(len(log))
            self._sessions[session_id] = session

    def close_session(self, session_id: str) -> None:
        with self._lock:
            s = self._get(session_id)
            self._recall_preps.pop(session_id, None)
            self._ops.drop(s.seq, s.positions.resident_count - sum(len(p.rng) for p in s.pending))
            del self._sessions[session_id]
            self._free_seqs.append(s.seq)

    # -- placing tokens -------------------------------------------------------------------
    def _check_tokens(self, tokens: Sequence[int]) -> list[int]:
        toks = token_ids(tokens, self._model.n_vocab)
        if not toks:
            raise ValueError("at least one token is needed")
        return toks

    def _materialize(self, s: _Session) -> None:
        """Restore deferred imports into the engine, in position order."""
        pending, s.pending = sorted(s.pending, key=lambda p: p.positions[0]), []
        for i, item in enumerate(pending):
            if not self._ops.restore(s.seq, item.block.payload, item.block.positions, item.delta):
                for lost in pending[i:]:
                    s.positions.evict(lost.rng, rebase=False)
                raise ContextFullError(
                    f"llama.cpp could not restore the imported block for {item.rng} (no room "
                    f"for its cells, or a payload it rejects); it and later imports are evicted "
                    "again", needed=len(item.rng), free=self.free_cells(),
                )

    # -- the executor contract ------------------------------------------------------------
    def append(self, session_id: str, tokens: Sequence[int]) -> npt.NDArray[np.float32]:
        with self._lock:
            s = self._get(session_id)
            toks = self._check_tokens(tokens)
            self._ensure_room(len(toks))
            self._materialize(s)
            taken = self._take_prefill(s, toks)
            if taken is not None:
                return taken
            logits = self._ops.place(s.seq, toks, s.positions.next_pos)
            s.positions.append(len(toks))
            s.tokens.extend(toks)
            s.logits = logits
            return logits.copy()

    def append_many(self, items: Sequence[tuple[str, Sequence[int]]]) -> list[npt.NDArray[np.float32]]:
        """Continuous batching: every session whose tokens continue its sequence is decoded in the
        same ``llama_decode`` batches (up to ``n_batch`` tokens each); the others (after a
        position gap) go through ``append`` one by one. All or nothing for the batched ones."""
        with self._lock:
            checked = [(self._get(sid), sid, self._check_tokens(toks)) for sid, toks in items]
            if len({sid for _, sid, _ in checked}) != len(checked):
                raise ValueError("append_many takes each session at most once")
            self._ensure_room(sum(len(t) for _, _, t in checked))
            out: list[npt.NDArray[np.float32] | None] = [None] * len(items)
            batch: list[int] = []
            for i, (s, sid, toks) in enumerate(checked):
                self._materialize(s)
                out[i] = self._take_prefill(s, toks)
                if out[i] is not None:
                    continue
                last = self._ctx.pos_max(s.seq)
                if last < 0 or last + 1 == s.positions.next_pos:
                    batch.append(i)
                else:
                    out[i] = self.append(sid, toks)
            if batch:
                for i in batch:
                    s, _, toks = checked[i]
                    self._ops.unpark(s.seq, s.positions.next_pos, s.positions.next_pos + len(toks))
                n = sum(len(checked[i][2]) for i in batch)
                self._ops.reserve(n)
                logits = self._ctx.decode_many(
                    [(checked[i][2], checked[i][0].positions.next_pos, checked[i][0].seq) for i in batch])
                self._ops.shift_pending = False
                self._ops.live += n
                for i, lg in zip(batch, logits, strict=True):
                    s, _, toks = checked[i]
                    s.positions.append(len(toks))
                    s.tokens.extend(toks)
                    s.logits = lg
                    out[i] = lg.copy()
            return [lg for lg in out if lg is not None]

    def _take_prefill(self, s: _Session, toks: list[int]) -> npt.NDArray[np.float32] | None:
        """Append ``toks`` from the session's prefill (their cells restored, moved to where they
        go, no decode) when it holds exactly them and the session is as the prefill expects."""
        p, s.prefill = s.prefill, None
        if p is None or p.tokens != tuple(toks) or not np.array_equal(p.positions, s.positions.all_positions()):
            return None
        first = s.positions.next_pos
        try:
            cells = self._moved(p.cells, np.arange(first, first + len(toks), dtype=np.int64))
        except CapabilityError:
            return None  # its keys cannot be moved here: decode the tokens after all
        self._ops.reserve(len(toks))
        if not self._ops.restore(s.seq, cells.to_blob(not self.flash_attn), cells.positions.tolist(), 0):
            return None
        s.positions.append(len(toks))
        s.tokens.extend(toks)
        s.logits = p.logits
        return p.logits.copy()

    def evict_range(self, session_id: str, rng: Range, rebase: bool = False) -> None:
        with self._lock:
            s = self._get(session_id)
            if rebase and not self._caps.position_shift:
                raise CapabilityError("this model's cache cannot shift positions (position_shift is false)")
            positions = s.positions.positions(rng)
            self._materialize(s)
            op = s.positions.evict(rng, rebase)
            self._ops.remove(s.seq, positions, op.shift)
            s.logits = None

    def admit_range(self, session_id: str, rng: Range) -> None:
        with self._lock:
            s = self._get(session_id)
            op = s.positions.plan_admit(rng)
            self._ensure_room(len(rng))
            if op.tail_shift:
                self._ops.require_shift(f"admitting {rng} (the resident tail moves up {op.tail_shift})")
            self._materialize(s)
            if op.tail_shift:
                self._ops.shift(s.seq, op.tail_from, op.tail_shift)
            try:
                logits = self._ops.place(s.seq, s.tokens[rng.start : rng.end], op.first_position)
            except BaseException:
                if op.tail_shift:
                    self._ops.shift(s.seq, op.tail_from + op.tail_shift, -op.tail_shift)
                raise
            s.positions.admit(rng)
            s.logits = logits if rng.end == len(s.tokens) else None

    def export_range(self, session_id: str, rng: Range) -> KVBlock:
        with self._lock:
            s = self._get(session_id)
            positions = s.positions.positions(rng)
            self._require_export()
            self._materialize(s)
            whole = not s.pending and len(rng) == s.positions.resident_count
            payload = self._ops.export(s.seq, int(positions[0]), int(positions[-1]) + 1, whole)
            cells = read_cell_positions(payload)
            if not np.array_equal(np.sort(cells), positions):
                raise EngineError(f"exported cells {cells[:8].tolist()}... do not match the positions of {rng}")
            return KVBlock(
                fingerprint=self.fingerprint, model_id=self.model_id, engine=ENGINE,
                type_k=self.type_k, type_v=self.type_v, geometry=self.geometry,
                session_id=session_id, token_range=rng,
                token_ids=tuple(s.tokens[rng.start : rng.end]), payload=payload,
                positions=tuple(positions.tolist()),
                meta={"payload_format": self.payload_format},
            )

    def _require_export(self) -> None:
        if not self._caps.kv_export:
            raise CapabilityError(
                f"KV export / import is not supported for {self.model_path.name} "
                f"(sliding-window cache of {self._model.n_swa} tokens)"
            )

    def _check_llama_block(self, s: _Session, session_id: str, block: KVBlock) -> None:
        self._require_export()
        self._check_block(session_id, block, self.fingerprint)
        rng = block.token_range
        s.positions.check_evicted(rng)
        size = expected_payload_size(len(rng), self.geometry.n_layers, self._k_row, self._v_row)
        if block.payload_nbytes != size:
            raise BlockMismatchError(
                f"block for {rng} has a {block.payload_nbytes}-byte payload; {len(rng)} cells of "
                f"this model and KV types take {size} bytes"
            )
        cells = read_cell_positions(block.payload)
        if not block.positions or not np.array_equal(np.sort(cells), np.asarray(block.positions)):
            raise BlockMismatchError(
                f"block for {rng}: its payload's cell positions do not match its header positions"
            )

    def import_range(self, session_id: str, block: KVBlock) -> None:
        """Make a block's range resident from its exported KV. When no resident cell has to
        move, the restore is deferred to the session's next engine operation, so blocks
        imported in any order are laid out in position order (see ``cache_ops``)."""
        with self._lock:
            s = self._get(session_id)
            self._check_llama_block(s, session_id, block)
            rng = block.token_range
            offsets = np.asarray(block.positions, dtype=np.int64) - block.positions[0]
            op = s.positions.plan_admit(rng, offsets, preferred_first=block.positions[0])
            self._ensure_room(len(rng))
            item = _PendingImport(block, rng, op.positions, op.positions[0] - block.positions[0])
            if op.tail_shift or item.delta:
                self._ops.require_shift(f"importing {rng} at position {op.positions[0]} (exported at "
                                        f"{block.positions[0]}, tail moves {op.tail_shift})")
            if op.tail_shift:
                self._materialize(s)
                self._ops.shift(s.seq, op.tail_from, op.tail_shift)
            s.positions.admit(rng, offsets, preferred_first=block.positions[0])
            s.pending.append(item)
            if op.tail_shift:
                self._materialize(s)
            s.logits = None

    def flush(self, session_id: str | None = None) -> None:
        """Do deferred work now: restore the session's (or every session's) pending imports and
        apply pending K-shifts, so the next decode pays only for itself."""
        with self._lock:
            sessions = [self._get(session_id)] if session_id is not None else list(self._sessions.values())
            for s in sessions:
                self._materialize(s)
            self._ops.flush_shifts()

    def keys(self, session_id: str) -> KeyCapture:
        """The resident keys, read from a state export of the session's own sequence."""
        with self._lock:
            s = self._get(session_id)
            if not self._caps.key_access:
                raise CapabilityError(f"keys of a {self.type_k} K cache cannot be read as floats")
            self._materialize(s)
            self._ops.flush_shifts()
            payload = self._ctx.state_get(s.seq)
            cells = read_cell_positions(payload)
            keys = read_keys(payload, self.geometry.n_layers, self.geometry.n_kv_heads,
                             self.geometry.head_dim, self.type_k)
            log_index = np.nonzero(s.positions.resident_mask())[0].astype(np.int64)
            by_position = dict(zip(s.positions.all_positions()[log_index].tolist(), log_index.tolist(), strict=True))
            return KeyCapture(keys, np.asarray([by_position[int(p)] for p in cells], dtype=np.int64))

    # -- attention ------------------------------------------------------------------------
    def attention(self, session_id: str, window: int | None = None) -> AttentionCapture:
        """Attention of the session's last ``window`` resident tokens over all resident tokens,
        from a re-prefill in the scoring context (keys/queries labelled by token-log index)."""
        with self._lock:
            s = self._get(session_id)
            mask = s.positions.resident_mask()
            if not mask.any():
                raise RangeError(f"session {session_id!r} has no resident tokens to score")
            log_index = np.nonzero(mask)[0].astype(np.int64)
            tokens = np.asarray(s.tokens, dtype=np.int32)[mask]
            return self._scoring_context().capture(tokens.tolist(), log_index, window or self.score_window)

    def _scoring_context(self) -> ScoringContext:
        if self._scoring is None:
            self._scoring = ScoringContext(self._model, self.n_ctx + _RESERVED_CELLS, self.n_batch, self.n_threads)
        return self._scoring

    # -- recall: many blocks in one engine step --------------------------------------------
    def recall_attention(
        self, session_id: str, blocks: Sequence[KVBlock], tokens: Sequence[int], window: int, rebase: bool
    ) -> AttentionCapture:
        """Attention of the last ``window`` of ``tokens`` over the resident cells, the blocks' cells
        (at the positions importing them all would give) and ``tokens``: one state restore into the
        scoring context and a decode of ``tokens`` there, no re-prefill. The session is unchanged."""
        with self._lock:
            s = self._get(session_id)
            toks = self._check_tokens(tokens)
            prep = self._recall_preps.pop(session_id, None)
            if prep is None or not prep.holds(s, blocks, rebase):
                prep = self._recall_prep(s, session_id, blocks, rebase)
            # the exchange that follows a recall reads the same cells: keep them for it
            self._recall_memo = prep.memo
            first = prep.first
            keys = np.concatenate([prep.memo.index, len(s.tokens) + np.arange(len(toks), dtype=np.int64)])
            capture, logits, own = self._scoring_context().capture_after(prep.blob, prep.n_cells, toks, first, keys,
                                                                         window, holder=prep)
            s.prefill = None
            if self.type_k == self.type_v == "f16":  # the scoring context's types: its cells fit as they are
                fresh = parse_cells([own])
                if np.array_equal(fresh.positions, np.arange(first, first + len(toks))):
                    s.prefill = _Prefill(tuple(toks), fresh, logits, s.positions.all_positions())
            return capture

    def prepare_recall(self, session_id: str, blocks: Sequence[KVBlock], rebase: bool) -> bool:
        """Do now what ``recall_attention`` of these blocks does before it decodes the turn (read,
        check, merge and move the cells, encode the scoring context's state), kept for the
        session's next recall while its positions stay as they are. False when the cells would
        take more than ``RECALL_PREP_BYTES`` (prepared sessions together: the oldest go first)."""
        with self._lock:
            s = self._get(session_id)
            self._recall_preps.pop(session_id, None)
            n_cells = s.positions.resident_count + sum(len(b.token_range) for b in blocks)
            per_cell = self.geometry.n_layers * (self._k_row + self._v_row)
            if 3 * n_cells * per_cell > RECALL_PREP_BYTES:  # resident, merged and encoded copies
                return False
            prep = self._recall_prep(s, session_id, blocks, rebase)
            self._recall_preps[session_id] = prep
            self._scoring_context().load(prep.blob, prep.n_cells, prep)
            held = sum(p.nbytes for p in self._recall_preps.values())
            while held > RECALL_PREP_BYTES and len(self._recall_preps) > 1:
                held -= self._recall_preps.popitem(last=False)[1].nbytes
            return True

    def _recall_prep(self, s: _Session, session_id: str, blocks: Sequence[KVBlock], rebase: bool) -> _RecallPrep:
        spans = _spans_of(blocks)
        layout = exchange_layout(s.positions, (), spans, rebase)
        self._check_blocks(s, session_id, blocks, spans)
        old = self._resident_cells(s)
        merged, log_index = self._merged_cells(s, blocks, layout.resident, old, spans)
        memo = _RecallMemo(session_id, s.positions.all_positions(), old, merged, log_index,
                           frozenset(id(b) for b in blocks))
        cells = self._moved(merged, layout.positions[log_index])
        # the scoring context holds f16 and, without flash attention, V transposed
        blob = _as_f16(cells, self.type_k, self.type_v).to_blob(v_trans=True) if len(cells) else b""
        first = int(cells.positions[-1]) + 1 if len(cells) else 0
        return _RecallPrep(tuple(blocks), rebase, memo, blob, len(cells), first)

    def exchange(self, session_id: str, evict: Sequence[Range], blocks: Sequence[KVBlock], rebase: bool) -> list[KVBlock]:
        """Evict ``evict`` and import ``blocks`` in one state restore: the session's cells are read
        once, merged with the blocks' in numpy, moved to ``exchange_layout``'s positions (keys turned
        by ``rope.KeyRotation``) and written back; the evicted ranges come back exported."""
        with self._lock:
            s = self._get(session_id)
            if rebase and not self._caps.position_shift:
                raise CapabilityError("this model's cache cannot shift positions (position_shift is false)")
            spans = _spans_of(blocks)
            layout = exchange_layout(s.positions, evict, spans, rebase)
            memo, self._recall_memo = self._recall_memo, None
            if memo is None or memo.session_id != session_id or s.pending \
                    or not np.array_equal(memo.positions, s.positions.all_positions()):
                memo = None
            old, old_index = memo.old if memo is not None else self._resident_cells(s)
            bounds = np.searchsorted(old_index, [(r.start, r.end) for r in evict]).reshape(-1, 2)
            exported = [self._block_of(session_id, s, rng, old.take(np.arange(lo, hi)))
                        for rng, (lo, hi) in zip(evict, bounds.tolist(), strict=True)]
            if memo is not None and all(id(b) in memo.blocks for b in blocks):
                keep = layout.resident[memo.index]  # cells of blocks left cold are not resident there
                cells, log_index = memo.cells.take(np.nonzero(keep)[0]), memo.index[keep]
            else:
                self._check_blocks(s, session_id, blocks, spans)
                cells, log_index = self._merged_cells(s, blocks, layout.resident, (old, old_index), spans)
            cells = self._moved(cells, layout.positions[log_index])
            self._ensure_room(len(cells) - len(old))
            if len(old):
                self._ops.remove(s.seq, old.positions, 0)
            if len(cells):
                self._ops.reserve(len(cells))
                if not self._ops.restore(s.seq, cells.to_blob(not self.flash_attn), cells.positions.tolist(), 0):
                    restored = len(old) and self._ops.restore(s.seq, old.to_blob(not self.flash_attn),
                                                              old.positions.tolist(), 0)
                    if not restored:
                        s.positions.relayout(np.zeros(len(s.tokens), dtype=bool), np.zeros(len(s.tokens)), 0)
                    raise ContextFullError(
                        f"llama.cpp could not restore {len(cells)} cells for session {session_id!r}"
                        + ("; it is as before" if restored else "; its KV is lost (its tokens are not)"),
                        needed=len(cells), free=self.free_cells(),
                    )
            before = s.positions.all_positions()
            s.positions.relayout(layout.resident, layout.positions, layout.next_pos)
            s.logits = None
            if s.prefill is not None and np.array_equal(s.prefill.positions, before):
                s.prefill = replace(s.prefill, positions=s.positions.all_positions())
            else:
                s.prefill = None
            return exported

    def _check_blocks(self, s: _Session, session_id: str, blocks: Sequence[KVBlock], spans: BlockSpans) -> None:
        """What ``_check_llama_block`` checks, for many blocks at once (ranges are checked by
        ``exchange_layout``, cell positions when the payloads are parsed)."""
        self._require_export()
        if not blocks:
            return
        for block in blocks:
            if not isinstance(block, KVBlock):
                raise BlockMismatchError(f"expected a KVBlock, got {type(block).__name__}")
            if block.fingerprint != self.fingerprint:
                block.check_fingerprint(self.fingerprint)
        nbytes = np.fromiter((len(b.payload) if isinstance(b.payload, bytes) else b.payload_nbytes for b in blocks),
                             dtype=np.int64, count=len(blocks))
        cols = spans.spans
        lens = cols[:, 1] - cols[:, 0]
        g = self.geometry
        sizes = 16 + 12 * lens + 8 + g.n_layers * (24 + lens * (self._k_row + self._v_row))
        bad = np.nonzero(sizes != nbytes)[0]
        if bad.size:
            b = blocks[int(bad[0])]
            raise BlockMismatchError(f"block for {b.token_range} has a {b.payload_nbytes}-byte payload; its "
                                     f"{len(b.token_range)} cells of this model and KV types take {int(sizes[bad[0]])}")
        check_block_token_ids(session_id, s.tokens, blocks)

    def _resident_cells(self, s: _Session) -> tuple[StateCells, npt.NDArray[np.int64]]:
        """The session's resident cells in log order (one state read), with their log indices."""
        self._materialize(s)
        self._ops.flush_shifts()  # the K rows read must carry their rotation
        index = np.nonzero(s.positions.resident_mask())[0].astype(np.int64)
        if not index.size:
            return _empty_cells(self), index
        cells = parse_cells([self._ctx.state_get(s.seq)])
        if np.any(np.diff(cells.positions) < 0):
            cells = cells.take(np.argsort(cells.positions, kind="stable"))
        if not np.array_equal(cells.positions, s.positions.all_positions()[index]):
            raise EngineError(f"sequence {s.seq} holds other cells than its session's positions say")
        return cells, index

    def _merged_cells(
        self, s: _Session, blocks: Sequence[KVBlock], keep: npt.NDArray[np.bool_],
        old: tuple[StateCells, npt.NDArray[np.int64]], spans: BlockSpans | None = None,
    ) -> tuple[StateCells, npt.NDArray[np.int64]]:
        """The ``old`` cells where ``keep`` says so and the blocks' cells, in log order, with the
        log index of each (cells keep the positions they were stored at)."""
        parts, index = [], []
        if len(old[0]):
            held = keep[old[1]]
            parts.append(old[0] if held.all() else old[0].take(np.nonzero(held)[0]))
            index.append(old[1][held])
        if blocks:
            cols = (spans or _spans_of(blocks)).spans
            expected = (spans or _spans_of(blocks)).positions
            lens = cols[:, 1] - cols[:, 0]
            cells = parse_cells([b.payload for b in blocks])
            owner = np.repeat(np.arange(len(blocks)), lens)
            if not np.array_equal(cells.positions, expected):  # payloads list cells in cell order: sort them
                cells = cells.take(np.lexsort((cells.positions, owner)))
                if not np.array_equal(cells.positions, expected):
                    bad = blocks[int(owner[np.nonzero(cells.positions != expected)[0][0]])]
                    raise BlockMismatchError(
                        f"block for {bad.token_range}: its payload's cell positions do not match its header positions")
            parts.append(cells)
            index.append(cols[owner, 0] + np.arange(len(cells)) - np.repeat(np.cumsum(lens) - lens, lens))
        if not parts:
            return _empty_cells(self), np.zeros(0, dtype=np.int64)
        if len(parts) == 1:
            return parts[0], index[0]
        # interleave the two runs (each in log order) straight into place
        log_index = np.concatenate(index)
        order = np.argsort(log_index, kind="stable")
        slot = np.empty_like(order)
        slot[order] = np.arange(order.size)
        a, b = parts
        k = np.empty((a.k.shape[0], order.size, a.k.shape[2]), dtype=np.uint8)
        v = np.empty((a.v.shape[0], order.size, a.v.shape[2]), dtype=np.uint8)
        pos = np.empty(order.size, dtype=np.int64)
        for part, where in ((a, slot[: len(a)]), (b, slot[len(a) :])):
            k[:, where], v[:, where], pos[where] = part.k, part.v, part.positions
        return StateCells(a.prefix, pos, k, v, a.k_types, a.v_types, a.v_el), log_index[order]

    def _moved(self, cells: StateCells, target: npt.NDArray[np.int64]) -> StateCells:
        """``cells`` at ``target`` positions, their keys turned by how far each moved."""
        delta = target - cells.positions
        moved = np.nonzero(delta)[0]
        if not moved.size:
            return cells.with_positions(target)
        rotation = self._key_rotation()
        if rotation is None or self.type_k not in _FLOAT_DTYPES:
            raise CapabilityError(
                f"cells of a {self.type_k} K cache cannot be moved to other positions here"
                + ("" if rotation is None else " (numpy turns f32 / f16 keys only)"))
        g = self.geometry
        every = moved.size == delta.size  # then no gather / scatter of the moved rows
        k = cells.k.copy() if not every else cells.k
        rows = (k if every else k[:, moved]).view(_FLOAT_DTYPES[self.type_k])
        rows = rows.reshape(g.n_layers, moved.size, g.n_kv_heads, g.head_dim)
        if self.type_k == "f16":
            rows = f16_to_f32(rows)
        turned = rotation.rotate(rows, delta[moved], axis=1)
        back = (f32_to_f16(turned) if self.type_k == "f16" else turned).reshape(g.n_layers, moved.size, -1).view(np.uint8)
        if every:
            return cells.with_positions(target, back)
        k[:, moved] = back
        return cells.with_positions(target, k)

    def _key_rotation(self) -> KeyRotation | None:
        if not hasattr(self, "_rotation"):
            self._rotation = key_rotation(self._model.ptr, read_gguf_metadata(self.model_path))
        return self._rotation

    def _block_of(self, session_id: str, s: _Session, rng: Range, cells: StateCells) -> KVBlock:
        return KVBlock(
            fingerprint=self.fingerprint, model_id=self.model_id, engine=ENGINE,
            type_k=self.type_k, type_v=self.type_v, geometry=self.geometry,
            session_id=session_id, token_range=rng, token_ids=tuple(s.tokens[rng.start : rng.end]),
            payload=cells.to_blob(not self.flash_attn), positions=tuple(cells.positions.tolist()),
            meta={"payload_format": self.payload_format},
        )

    # -- generation -----------------------------------------------------------------------
    def _next_logits(self, s: _Session, session_id: str) -> npt.NDArray[np.float32]:
        if s.logits is not None:
            return s.logits
        if not s.tokens:
            raise ValueError(f"session {session_id!r} has no tokens; append a prompt first")
        # The cache changed since the last decode: recompute the last token against it.
        last = Range(len(s.tokens) - 1, len(s.tokens))
        if s.positions.resident_mask()[-1]:
            self.evict_range(session_id, last, rebase=False)
        self.admit_range(session_id, last)
        assert s.logits is not None
        return s.logits

    def stream(
        self,
        session_id: str,
        max_tokens: int,
        temperature: float = 0.0,
        seed: int | None = None,
        stop_at_eog: bool = True,
    ) -> Iterator[int]:
        """Yield up to ``max_tokens`` sampled tokens, each appended to the session as it comes
        (an end-of-generation token is yielded and appended, then the stream stops)."""
        self._get(session_id)
        if max_tokens < 0:
            raise ValueError(f"max_tokens={max_tokens} must be >= 0")
        sampler = TokenSampler(temperature, seed)
        return self._stream(session_id, int(max_tokens), sampler, stop_at_eog)

    def _stream(
        self, session_id: str, max_tokens: int, sampler: TokenSampler, stop_at_eog: bool
    ) -> Iterator[int]:
        for _ in range(max_tokens):
            with self._lock:
                s = self._get(session_id)
                token = sampler.sample(self._next_logits(s, session_id))
                self.append(session_id, [token])
            yield token
            if stop_at_eog and self._model.is_eog(token):
                return

    def generate(self, session_id: str, max_tokens: int, **options: Any) -> list[int]:
        """``stream`` collected: up to ``max_tokens`` tokens decoded in one call (greedy at
        temperature 0, else seeded sampling), appended to the session and returned."""
        return list(self.stream(session_id, max_tokens, **options))


def _empty_cells(ex: LlamaExecutor) -> StateCells:
    n_layer = ex.geometry.n_layers
    return StateCells(b"", np.zeros(0, dtype=np.int64), np.zeros((n_layer, 0, ex._k_row), dtype=np.uint8),
                      np.zeros((n_layer, 0, ex._v_row), dtype=np.uint8), (0,) * n_layer, (0,) * n_layer, 0)


def _as_f16(cells: StateCells, type_k: str, type_v: str) -> StateCells:
    """``cells`` with f16 K and V rows (what the scoring context holds); quantized rows are
    dequantized (``quant_rows``)."""
    for name in (type_k, type_v):
        if name not in _FLOAT_DTYPES and name not in DEQUANTIZABLE:
            raise CapabilityError(f"a {type_k}/{type_v} KV cache cannot be scored without re-prefilling it "
                                  f"(readable as f16: f16, f32, {', '.join(DEQUANTIZABLE)})")
    n_layer = cells.k.shape[0]
    f16 = 1  # GGML_TYPE_F16
    return StateCells(cells.prefix, cells.positions, _rows_f16(cells.k, type_k), _rows_f16(cells.v, type_v),
                      (f16,) * n_layer, (f16,) * n_layer, 2)


def _rows_f16(rows: npt.NDArray[np.uint8], type_name: str) -> npt.NDArray[np.uint8]:
    if type_name == "f16":
        return rows
    n_layer, n = rows.shape[0], rows.shape[1]
    if type_name == "f32":
        values = f32_to_f16(rows.view("<f4"))
    else:
        values = dequantize_rows(rows, type_name)
    return values.view(np.uint8).reshape(n_layer, n, -1)


def _spans_of(blocks: Sequence[KVBlock]) -> BlockSpans:
    return BlockSpans.of([(b.token_range, b.positions) for b in blocks])
