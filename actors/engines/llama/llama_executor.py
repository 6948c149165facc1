"""The llama.cpp executor: the executor contract on llama-cpp-python's low-level API.

Primitives:
- ``LlamaExecutor(model_path, n_ctx=4096, n_seq_max=8, type_k="f16", type_v="f16",
  n_threads=None, n_batch=512, flash_attn=None, score_window=32, score_kernel=7,
  n_gpu_layers=None, main_gpu=None, swa_full=False, kv_layout="unified")`` (layers offloaded and main
  device; None: llama.cpp's default; ``swa_full``: llama.cpp's full-size cache for windowed layers
  instead of the small one; ``kv_layout="split"``: one KV stream per session, below), an
  ``kvres.actors.engines.executor.Executor``: ``capabilities``, ``open_session(session_id, tokens=())``,
  ``append``, ``append_many_first`` (a step's prompts in passes of their own in the split
  layout), ``token_log``, ``resident_ranges``, ``evict_range``, ``admit_range``,
  ``export_range``, ``import_range``, ``attention`` (raw capture), ``keys``, ``recall_attention``,
  ``prepare_recall``, ``exchange``, ``tokenize``, ``detokenize``, ``close_session``, ``kv_profile``,
  ``claim_decode_threads`` / ``reserve_decode_threads`` (which thread decodes with ``n_threads``,
  see ``decode_threads``), ``end_of_generation`` (every id ``llama_vocab_is_eog`` holds for,
  scanned once), ``chat_template``, ``truncate``, ``fork_session`` and ``share_prefix``
  (``edits``), ``sampler`` (llama.cpp's sampler chain, ``sampler_chain.LlamaSampler``).
  Beyond it: ``generate``, ``stream``, ``cache_positions``, ``sessions``, ``free_cells``,
  ``flush``, ``close``; attributes ``fingerprint``, ``model_id``
  (``kvres.actors.model_files.model_id``), ``geometry``, ``n_ctx``, ``n_seq_max``, ``type_k``,
  ``type_v``, ``flash_attn``, ``n_vocab``.

One engine context serves every session (opened by ``context_setup``, shaped as
``cache_shape`` says): unified KV, sequence id i per session (``sequence_slots``; plus its
parking sequence and one shared scratch sequence, see ``cache_ops``). ``n_ctx`` is the token
budget of all sessions together; ``n_seq_max`` the number of sessions. Ranges are token-log
positions and ``kvres.policy.positions.PositionMap`` decides every cache position, so this
executor places tokens exactly where every other executor would.

``kv_layout="split"``: a KV stream of ``n_ctx / n_seq_max`` cells per session, no parking or
scratch sequences, no eviction from the middle or position shift (``stream_ops``); a step's
sessions gather on the lowest streams (``SequenceSlots.gather``).

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
- recall (``recall_attention``, ``prepare_recall``, ``exchange``): many blocks in one state write,
  their cells merged and moved in numpy (``recall_exchange``); this module writes the result
  into the session.

Exactness: the same cells in the same order give bit-identical logits (export / evict / import,
suspend / resume). With flash attention llama.cpp's CPU kernel rounds in KV-cell order, so a
different physical layout (another session's cells interleaved, a batch split differently)
changes logits at the 1e-4..1e-3 level; ``cache_ops`` keeps each session's cells in position
order so that re-imports land where they were.

Sliding-window models (``n_swa > 0``) keep a second cache for their windowed layers, by default
llama.cpp's small one (``swa_full=False``: the window of every sequence plus one micro-batch, what
``kvres capacity`` prices), which cannot shift positions (``position_shift`` false: policies keep
gaps). Their blocks hold both caches (``blocks.BlockFormat(windowed=True)``): exported and
imported whole and exactly (spill, suspend, resume, migrate), but not merged as cells, so a recall
imports its cold blocks instead of exchanging them after a scoring pass (docs/notes.md,
Sliding-window models).

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
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from kvres.actors.chat_source import ChatTemplateSource, read_chat_template
from kvres.actors.engines.executor import Executor
from kvres.actors.engines.session_table import SessionTable
from kvres.actors.model_files import profile_from_gguf
from kvres.actors.sampling import Sampler, SamplingParams, TokenSampler
from kvres.coldstore.block import KVBlock
from kvres.policy.capabilities import Capabilities
from kvres.policy.capacity import LayerKVProfile
from kvres.policy.errors import CapabilityError, RangeError, SessionExistsError
from kvres.policy.ranges import Range
from kvres.policy.scorers import KeyCapture
from kvres.policy.scoring import AttentionCapture
from kvres.policy.tokens import token_ids

from . import edits
from .attention import ScoringContext
from .blocks import ENGINE
from .cache_shape import RESERVED_CELLS, default_threads
from .context_setup import open_cache
from .decode_threads import claim_decode_threads, reserve_decode_threads
from .engine import LlamaModel
from .executor_args import check_args
from .llama_errors import ContextFullError, EngineError, SessionLimitError
from .recall_exchange import RecallExchange
from .sampler_chain import LlamaSampler
from .sequence_slots import SequenceSlots
from .session import PendingImport, Session
from .state_blob import read_cell_positions, read_keys
from .stream_ops import StreamOps


class LlamaExecutor(SessionTable[Session], Executor):
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
        swa_full: bool = False,
        kv_layout: str = "unified",
    ) -> None:
        self.n_ctx, flash_attn = check_args(n_ctx, n_seq_max, type_k, type_v, flash_attn, n_batch, score_window,
                                            score_kernel, kv_layout)
        self.kv_layout = kv_layout
        self.n_seq_max = int(n_seq_max)
        self.type_k, self.type_v = type_k, type_v
        # None: on, except a split cache on the CPU, where llama.cpp's flash-attention kernel takes a
        # prompt's rows one by one (8 prompts over 2,000-token streams: 842 ms on, 399 ms off)
        self.flash_attn = (kv_layout != "split" or bool(n_gpu_layers)) if flash_attn is None else bool(flash_attn)
        self.n_threads = int(n_threads) if n_threads else default_threads()
        self.n_batch = int(n_batch)
        self.score_window, self.score_kernel = int(score_window), int(score_kernel)
        self.model_path = Path(model_path)

        self._model = LlamaModel(model_path, n_gpu_layers=n_gpu_layers, main_gpu=main_gpu)
        self._scoring: ScoringContext | None = None
        cache = open_cache(self._model, self.model_path, n_ctx=self.n_ctx, n_seq_max=self.n_seq_max, type_k=type_k,
                           type_v=type_v, flash_attn=self.flash_attn, n_batch=self.n_batch, n_threads=self.n_threads,
                           n_gpu_layers=n_gpu_layers, swa_full=swa_full, kv_layout=kv_layout)
        self.geometry, self._ctx, self._ops = cache.geometry, cache.ctx, cache.ops
        self._slots = SequenceSlots(self.n_seq_max)
        self._sessions: dict[str, Session] = {}
        self._lock = threading.RLock()
        self._eog: frozenset[int] | None = None
        self._template: tuple[ChatTemplateSource | None] | None = None  # read once: the model is loaded

        self.model_id, self._fmt, self._caps = cache.model_id, cache.fmt, cache.caps
        self.payload_format, self.fingerprint = self._fmt.payload_format, self._fmt.fingerprint
        # through a weak proxy: a cycle would keep a dropped executor's contexts alive until a GC pass
        me = weakref.proxy(self)
        self._recall = RecallExchange(self._fmt, self._model, self.model_path, self._ops,
                                      lambda: me._scoring_context(), lambda s: me._materialize(s),
                                      lambda n: me._ensure_room(n))

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

    def claim_decode_threads(self) -> None:
        """The calling thread's decodes use ``n_threads`` (``decode_threads.claim_decode_threads``)."""
        claim_decode_threads()

    def reserve_decode_threads(self) -> None:
        """Until a thread claims, every thread decodes on one (``decode_threads.reserve_decode_threads``)."""
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

    def session_cells(self) -> int | None:
        return self._ops.cells_per_session if isinstance(self._ops, StreamOps) else None

    def kv_profile(self) -> LayerKVProfile:
        """KV bytes per token from the GGUF's layers (sliding-window ones included) and the KV types."""
        return profile_from_gguf(self.model_path, self.type_k, self.type_v)

    def tokenize(self, text: str, add_bos: bool = True, special: bool = False) -> list[int]:
        return self._model.tokenize(text, add_bos=add_bos, parse_special=special)

    def detokenize(self, tokens: Sequence[int], special: bool = False) -> str:
        return self._model.detokenize(tokens, render_special=special)

    def end_of_generation(self) -> frozenset[int]:
        if self._eog is None:
            self._eog = self._model.eog_ids()
        return self._eog

    def chat_template(self) -> ChatTemplateSource | None:
        if self._template is None:  # each chat turn asks: a stat and a path resolve per ask were 5% of the GIL
            self._template = (read_chat_template(self.model_path),)
        return self._template[0]

    def sampler(self, params: SamplingParams) -> Sampler:
        return LlamaSampler(self._model, params)

    @property
    def n_vocab(self) -> int:
        return self._model.n_vocab

    def free_cells(self) -> int:
        """KV cells not held by any session's resident tokens."""
        used = sum(s.positions.resident_count for s in self._sessions.values())
        return self.n_ctx - used

    def _ensure_room(self, n: int, s: Session | None = None) -> int:
        """The free cells, when ``n`` of them are free (else ``ContextFullError``); in a split
        layout also in session ``s``'s own stream."""
        if s is not None and isinstance(self._ops, StreamOps):
            self._ops.reserve_for(s.seq, n)
        free = self.free_cells()
        if n > free:
            raise ContextFullError(
                f"the context has {free} free KV cells of n_ctx={self.n_ctx}; {n} are needed",
                needed=n, free=free,
            )
        return free

    # -- sessions -------------------------------------------------------------------------
    def open_session(self, session_id: str, tokens: Sequence[int] = ()) -> None:
        """Open a session; ``tokens`` become its token log with no KV resident (a restored
        session, filled back by ``import_range`` / ``admit_range``)."""
        with self._lock:
            if session_id in self._sessions:
                raise SessionExistsError(session_id)
            log = self._check_tokens(tokens) if len(tokens) else []
            if not self._slots.has_free():
                raise SessionLimitError(
                    f"cannot open session {session_id!r}: all n_seq_max={self.n_seq_max} "
                    "sequences of the context are in use"
                )
            session = Session(self._slots.take(), tokens=log)
            session.positions.extend_evicted(len(log))
            self._sessions[session_id] = session

    def close_session(self, session_id: str) -> None:
        with self._lock:
            s = self._get(session_id)
            self._recall.forget(session_id)
            self._ops.drop(s.seq, s.positions.resident_count - sum(len(p.rng) for p in s.pending))
            del self._sessions[session_id]
            self._slots.release(s.seq)

    # -- placing tokens -------------------------------------------------------------------
    def _check_tokens(self, tokens: Sequence[int]) -> list[int]:
        toks = token_ids(tokens, self._model.n_vocab)
        if not toks:
            raise ValueError("at least one token is needed")
        return toks

    def _materialize(self, s: Session) -> None:
        """Restore deferred imports into the engine, in position order."""
        pending, s.pending = sorted(s.pending, key=lambda p: p.positions[0]), []
        held = s.positions.resident_count - sum(len(p.rng) for p in pending)  # cells in the engine now
        for i, item in enumerate(pending):
            if not self._ops.restore(s.seq, item.block.payload, item.block.positions, item.delta, held == 0):
                for lost in pending[i:]:
                    s.positions.evict(lost.rng, rebase=False)
                raise ContextFullError(
                    f"llama.cpp could not restore the imported block for {item.rng} (no room "
                    f"for its cells, or a payload it rejects); it and later imports are evicted "
                    "again", needed=len(item.rng), free=self.free_cells(),
                )
            held += len(item.rng)

    # -- the executor contract ------------------------------------------------------------
    def append(self, session_id: str, tokens: Sequence[int]) -> npt.NDArray[np.float32]:
        with self._lock:
            s = self._get(session_id)
            toks = self._check_tokens(tokens)
            self._ensure_room(len(toks), s)
            self._materialize(s)
            taken = self._recall.take_prefill(s, toks)
            if taken is not None:
                return taken
            return s.appended(toks, self._ops.place(s.seq, toks, s.positions.next_pos))

    def append_many(self, items: Sequence[tuple[str, Sequence[int]]]) -> list[npt.NDArray[np.float32]]:
        """Continuous batching: every session whose tokens continue its sequence is decoded in the
        same ``llama_decode`` batches (up to ``n_batch`` tokens each); the others (after a
        position gap) go through ``append`` one by one. All or nothing for the batched ones."""
        return self._append_many(items, 0, None)

    def append_many_first(self, first: Sequence[tuple[str, Sequence[int]]], rest: Sequence[tuple[str, Sequence[int]]],
                          between: Callable[[list[npt.NDArray[np.float32]]], None]) -> list[npt.NDArray[np.float32]]:
        """``append_many(first + rest)`` with ``between`` given the ``first`` items' logits as soon as
        they are known. In the split layout a prompt chunk and one-token decodes never share a
        micro-batch (llama.cpp cuts a step's micro-batches to equal token counts per stream), so the
        ``first`` items are decoded in a ``llama_decode`` of their own, then ``between`` runs, then the
        ``rest``: a step costs what it did, and a prompt's logits come before the others' decodes.
        In the unified layout they share one pass (``between`` runs after it). Each part is all or
        nothing; a failing ``rest`` leaves ``first`` appended."""
        return self._append_many([*first, *rest], len(first), between)

    def _append_many(self, items: Sequence[tuple[str, Sequence[int]]], n_first: int,
                     between: Callable[[list[npt.NDArray[np.float32]]], None] | None) -> list[npt.NDArray[np.float32]]:
        with self._lock:
            checked = [(self._get(sid), sid, self._check_tokens(toks)) for sid, toks in items]
            if len({sid for _, sid, _ in checked}) != len(checked):
                raise ValueError("append_many takes each session at most once")
            self._ensure_room(sum(len(t) for _, _, t in checked))
            for s, _, toks in checked:
                self._ensure_room(len(toks), s)
            out: list[npt.NDArray[np.float32] | None] = [None] * len(items)
            batch: list[int] = []
            for i, (s, sid, toks) in enumerate(checked):
                self._materialize(s)
                out[i] = self._recall.take_prefill(s, toks)
                if out[i] is not None:
                    continue
                last = self._ctx.pos_max(s.seq)
                if last < 0 or last + 1 == s.positions.next_pos:
                    batch.append(i)
                else:
                    out[i] = self.append(sid, toks)
            if batch and isinstance(self._ops, StreamOps) and self._ops.spare is not None:
                # refused before any stream moves: a move's copies are done by the decode that follows it
                self._ops.check_places([(checked[i][0].seq, checked[i][2], checked[i][0].positions.next_pos)
                                        for i in batch])
                # the whole step's sessions, before either part
                self._slots.gather([checked[i] for i in batch], self._sessions.values(), self._ops)
            # the split layout never decodes a prompt and one-token decodes in one pass: first ones first
            early = between if isinstance(self._ops, StreamOps) else None
            head = [i for i in batch if i < n_first] if early is not None else []
            self._place(checked, out, head)
            if early is not None:
                early([lg for lg in out[:n_first] if lg is not None])
            self._place(checked, out, batch[len(head):])
            if between is not None and early is None:
                between([lg for lg in out[:n_first] if lg is not None])
            return [lg for lg in out if lg is not None]

    def _place(self, checked: Sequence[tuple[Session, str, list[int]]],
               out: list[npt.NDArray[np.float32] | None], indices: Sequence[int]) -> None:
        """The items at ``indices`` (each at its sequence's end) in one ``place_many``, their logits
        into ``out``."""
        if not indices:
            return
        logits = self._ops.place_many(
            [(checked[i][0].seq, checked[i][2], checked[i][0].positions.next_pos) for i in indices])
        for i, lg in zip(indices, logits, strict=True):
            out[i] = checked[i][0].appended(checked[i][2], lg)

    def evict_range(self, session_id: str, rng: Range, rebase: bool = False) -> None:
        with self._lock:
            s = self._get(session_id)
            self._require_shift(rebase)
            positions = s.positions.positions(rng)
            self._materialize(s)
            self._ops.check_remove(s.seq, positions)  # before the positions change: refused changes nothing
            op = s.positions.evict(rng, rebase)
            self._ops.remove(s.seq, positions, op.shift)
            s.logits = None

    def _require_shift(self, rebase: bool) -> None:
        if rebase and not self._caps.position_shift:
            raise CapabilityError("this model's cache cannot shift positions (position_shift is false)")

    def admit_range(self, session_id: str, rng: Range) -> None:
        with self._lock:
            s = self._get(session_id)
            op = s.positions.plan_admit(rng)
            self._ensure_room(len(rng), s)
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
            self._fmt.require_export()
            self._materialize(s)
            whole = not s.pending and len(rng) == s.positions.resident_count
            payload = self._ops.export(s.seq, int(positions[0]), int(positions[-1]) + 1, whole)
            cells = read_cell_positions(payload)
            if not np.array_equal(np.sort(cells), positions):
                raise EngineError(f"exported cells {cells[:8].tolist()}... do not match the positions of {rng}")
            return self._fmt.block(session_id, rng, s.tokens[rng.start : rng.end], payload, positions.tolist())

    def import_range(self, session_id: str, block: KVBlock) -> None:
        """Make a block's range resident from its exported KV. When no resident cell has to
        move, the restore is deferred to the session's next engine operation, so blocks
        imported in any order are laid out in position order (see ``cache_ops``)."""
        with self._lock:
            s = self._get(session_id)
            self._fmt.require_export()
            self._check_block(session_id, block, self.fingerprint)
            rng = block.token_range
            s.positions.check_evicted(rng)
            self._fmt.check_payload(block)
            offsets = np.asarray(block.positions, dtype=np.int64) - block.positions[0]
            op = s.positions.plan_admit(rng, offsets, preferred_first=block.positions[0])
            self._ensure_room(len(rng), s)
            item = PendingImport(block, rng, op.positions, op.positions[0] - block.positions[0])
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

    def truncate(self, session_id: str, length: int) -> npt.NDArray[np.float32] | None:
        with self._lock:
            return edits.truncate(self._get(session_id), session_id, length, self._ops, self._recall,
                                  self._materialize)

    def fork_session(self, source_id: str, new_id: str) -> None:
        with self._lock:
            src = self._get(source_id)
            if new_id in self._sessions:
                raise SessionExistsError(new_id)
            if not self._slots.has_free():
                raise SessionLimitError(f"cannot fork session {source_id!r} into {new_id!r}: all "
                                        f"n_seq_max={self.n_seq_max} sequences of the context are in use")
            self._ensure_room(src.positions.resident_count)
            self._sessions[new_id] = edits.fork(src, self._slots.take(), self._ops, self._materialize)

    def share_prefix(self, source_id: str, session_id: str, n: int) -> None:
        with self._lock:
            edits.share_prefix(self._get(source_id), self._get(session_id), n, self._ops, self._materialize,
                               self._model.n_swa > 0, self._ensure_room)

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
            payload = self._ops.export(s.seq, 0, 0, whole=True)
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
            self._scoring = ScoringContext(self._model, self.n_ctx + RESERVED_CELLS, self.n_batch, self.n_threads)
        return self._scoring

    # -- recall: many blocks in one engine step (``recall_exchange``) -----------------------
    def recall_attention(
        self, session_id: str, blocks: Sequence[KVBlock], tokens: Sequence[int], window: int, rebase: bool
    ) -> AttentionCapture:
        """Attention of the last ``window`` of ``tokens`` over the resident cells, the blocks' cells
        (at the positions importing them all would give) and ``tokens``: one state restore into the
        scoring context and a decode of ``tokens`` there, no re-prefill. The session is unchanged."""
        with self._lock:
            s = self._get(session_id)
            return self._recall.attention(s, session_id, blocks, self._check_tokens(tokens), window, rebase)

    def prepare_recall(self, session_id: str, blocks: Sequence[KVBlock], rebase: bool) -> bool:
        """Do now what ``recall_attention`` of these blocks does before it decodes the turn (read,
        check, merge and move the cells, encode the scoring context's state), kept for the
        session's next recall while its positions stay as they are. False when the cells would
        take more than ``RECALL_PREP_BYTES`` (prepared sessions together: the oldest go first)."""
        with self._lock:
            return self._recall.prepare(self._get(session_id), session_id, blocks, rebase)

    @property
    def _recall_preps(self) -> Mapping[str, object]:
        """What ``prepare_recall`` holds, by session (named as the OpenVINO executor's)."""
        return self._recall.preps

    def exchange(self, session_id: str, evict: Sequence[Range], blocks: Sequence[KVBlock], rebase: bool) -> list[KVBlock]:
        """Evict ``evict`` and import ``blocks`` in one state restore: the session's cells are read
        once, merged with the blocks' in numpy, moved to ``exchange_layout``'s positions (keys turned
        by ``rope.KeyRotation``) and written back; the evicted ranges come back exported."""
        with self._lock:
            s = self._get(session_id)
            self._require_shift(rebase)
            return self._recall.exchange(s, session_id, evict, blocks, rebase)

    # -- generation -----------------------------------------------------------------------
    def _next_logits(self, s: Session, session_id: str) -> npt.NDArray[np.float32]:
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
