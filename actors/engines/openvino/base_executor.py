"""The OpenVINO executor's shared half: sessions over a stateful LLM IR, one infer request each.

Primitives:
- ``OpenVINOExecutor(model_path, device="CPU", precision="f32", num_threads=1, score_window=16,
  score_kernel=7, compiled_cache=SHARED_CACHE)``: an abstract ``kvres.actors.engines.executor.Executor``;
  ``StateExecutor`` (``state_mode.py``) and ``RecomputeExecutor`` (``recompute_mode.py``) are its
  two mechanisms, ``openvino_executor(model_path, mode, **options)`` (``modes.py``) builds one by
  name. Shared here: ``capabilities``, ``open_session``, ``append``, ``token_log``,
  ``resident_ranges``, ``cache_positions``, ``evict_range``, ``export_range``, ``import_range``
  (the block is checked here, placed by the mechanism), ``attention``, ``keys``,
  ``sync``, ``close_session``, ``sessions``, ``tokenize``, ``detokenize`` (``special``: control
  tokens, see ``text``), ``n_vocab``, ``end_of_generation`` (the GGUF's eos / eot / eom ids),
  ``chat_template`` (a GGUF source's), ``truncate`` (the states keep the kept tokens' entries; the
  logits come from running the last kept token over the entries before it, the states then put
  back as they were), ``fork_session`` (a new request holding a copy of the source's states),
  ``kv_profile``; attributes ``mode``, ``fingerprint``, ``kv_type``, ``loaded``.
- ``Session``: a session's infer request, token log, ``PositionMap`` and, while a change waits for
  ``sync``, the map its KV states still hold (``kv_map``).
- ``RecomputeError``: an engine call that recomputes KV failed; the token log and the KV the states
  held are as before (a deferred change stays pending).

A mechanism supplies ``_can_rebase()``, ``_apply_pending(session_id, s)`` (bring the states to
``s.positions``), ``admit_range`` and ``_place_block``. Positions always come from
``kvres.policy.positions.PositionMap``; state entry i is the i-th resident token in log order, so
the cache is ordered by position and the graph's causal mask by index is causal by position.
Evictions are recorded at once and carried out at the next ``sync`` (called by ``append``, export,
admission and scoring), so a plan of many evictions touches the states once. Both mechanisms export
the same payload (float32 ``[layer, k|v, kv_head, token, dim]``), so blocks move between them; the
fingerprint binds model id, engine, KV precision and geometry. Attention comes from an explicit
scoring pass over an attention-exposing clone of the graph (``scoring_pass``).
"""

from __future__ import annotations

import os
from abc import abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import numpy.typing as npt
import openvino as ov

from kvres.actors.chat_source import ChatTemplateSource, eog_ids, read_chat_template
from kvres.actors.engines.executor import Executor
from kvres.actors.engines.session_table import SessionTable
from kvres.coldstore.block import KVBlock, make_fingerprint
from kvres.policy.capabilities import Capabilities
from kvres.policy.capacity import LayerKVProfile
from kvres.policy.errors import (
    BlockMismatchError,
    CapabilityError,
    KvresError,
    RangeError,
    SessionExistsError,
)
from kvres.policy.positions import AdmitOp, PositionMap
from kvres.policy.ranges import Range
from kvres.policy.scorers import KeyCapture
from kvres.policy.scoring import AttentionCapture
from kvres.policy.tokens import token_ids

from ..session_table import check_truncate_length, truncated_positions
from .compiled import SHARED_CACHE, CompiledModelCache, compile_config
from .rope import rotate_keys
from .scoring_pass import ScoringPass, with_attention_outputs
from .states import KVArrays, kv_len, kv_to_payload, payload_to_kv, read_kv, take, write_kv
from .text import TextCodec

ENGINE = "openvino"
PRECISIONS = ("f32", "default")


class RecomputeError(KvresError, RuntimeError):
    """Re-prefilling a session's resident tokens failed; the session was restored unchanged."""


@dataclass
class Session:
    request: ov.InferRequest
    tokens: list[int] = field(default_factory=list)
    positions: PositionMap = field(default_factory=PositionMap)
    kv_map: PositionMap | None = None
    prefill: Any = None  # the next turn, decoded by a recall's scoring pass (state mode)

    @property
    def held(self) -> PositionMap:
        """The map the KV states correspond to (entry i = i-th resident token of this map)."""
        return self.kv_map if self.kv_map is not None else self.positions


def _kv_element(compiled: ov.CompiledModel, precision: str) -> tuple[str, int]:
    """The KV element type the plugin really uses (``f32``, ``f16``, ``u8``...) and its bits."""
    try:
        kv = compiled.get_property("KV_CACHE_PRECISION")
        return str(kv.to_string()), int(kv.bitwidth)
    except (RuntimeError, AttributeError):
        return precision, 32


class OpenVINOExecutor(SessionTable[Session], Executor):
    engine = ENGINE
    mode: ClassVar[str]
    _sessions: dict[str, Session]
    _score_holds: object | None = None  # a recall preparation whose states the scoring request holds

    def __init__(
        self,
        model_path: str | os.PathLike[str],
        device: str = "CPU",
        precision: str = "f32",
        num_threads: int = 1,
        score_window: int = 16,
        score_kernel: int = 7,
        compiled_cache: CompiledModelCache = SHARED_CACHE,
    ) -> None:
        if precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
        if score_window < 1:
            raise ValueError(f"score_window must be >= 1, got {score_window}")
        if score_kernel < 1 or score_kernel % 2 == 0:
            raise ValueError(f"score_kernel must be odd and >= 1, got {score_kernel}")
        self.score_window = score_window
        self.score_kernel = score_kernel
        self.device = device
        self.loaded, self._compiled = compiled_cache.get(Path(model_path), device, precision, num_threads)
        self._score_compiled: ov.CompiledModel | None = None
        self._score_pass: ScoringPass | None = None
        self._score_config = compile_config(precision, num_threads)
        self.kv_type, self._kv_bits = _kv_element(self._compiled, precision)
        self.fingerprint = make_fingerprint(
            self.loaded.model_id, ENGINE, self.kv_type, self.kv_type, self.loaded.geometry
        )
        self._sessions = {}
        self._codec: TextCodec | None = None
        scores = self.loaded.has_attention_probs
        self._caps = Capabilities(
            remove_middle=True, position_shift=self._can_rebase(),
            attention_capture=scores, key_access=True, kv_export=True,
        )

    # -- the mechanism ---------------------------------------------------------------------------
    @abstractmethod
    def _can_rebase(self) -> bool:
        """Whether this mechanism can move kept tokens to new positions for this model."""

    @abstractmethod
    def _apply_pending(self, session_id: str, s: Session) -> None:
        """Make the KV states hold exactly ``s.positions`` (they hold ``s.held``); clear ``kv_map``.
        On failure the states keep what they held and ``RecomputeError`` is raised."""

    @abstractmethod
    def _place_block(
        self, session_id: str, s: Session, block: KVBlock, part: KVArrays, new_map: PositionMap, op: AdmitOp
    ) -> None:
        """Make a checked block's range resident: ``new_map`` is ``s.positions`` with it admitted by
        ``op``; ``part`` is its KV at the exported positions."""

    def capabilities(self) -> Capabilities:
        return self._caps

    # -- sessions --------------------------------------------------------------------------------
    def open_session(self, session_id: str, tokens: Sequence[int] = ()) -> None:
        if session_id in self._sessions:
            raise SessionExistsError(session_id)
        toks = self._valid_tokens(tokens)
        s = Session(self._compiled.create_infer_request(), tokens=toks)
        s.positions.extend_evicted(len(toks))
        self._sessions[session_id] = s

    def close_session(self, session_id: str) -> None:
        self._get(session_id)
        del self._sessions[session_id]

    def _get(self, session_id: str) -> Session:
        s: Session = super()._get(session_id)
        return s

    # -- text ------------------------------------------------------------------------------------
    def _text(self) -> TextCodec:
        if self._codec is None:
            meta = self.loaded.tokenizer_meta
            if meta is not None:
                self._codec = TextCodec.from_gguf_meta(meta)
            else:
                self._codec = TextCodec.from_dir(Path(self.loaded.source).parent)
        return self._codec

    def tokenize(self, text: str, add_bos: bool = True, special: bool = False) -> list[int]:
        return self._text().tokenize(text, add_bos, special)

    def detokenize(self, tokens: Sequence[int], special: bool = False) -> str:
        return self._text().detokenize(self._valid_tokens(tokens), special)

    @property
    def n_vocab(self) -> int:
        return self.loaded.vocab_size

    def end_of_generation(self) -> frozenset[int]:
        if self.loaded.tokenizer_meta is not None:
            return eog_ids(self.loaded.tokenizer_meta)
        eos = self._text().eos_id
        return frozenset() if eos is None else frozenset({eos})

    def chat_template(self) -> ChatTemplateSource | None:
        source = Path(self.loaded.source)
        return read_chat_template(source) if source.suffix == ".gguf" else None

    def kv_profile(self) -> LayerKVProfile:
        """KV bytes per token from the IR's KV states: every layer global (no sliding window is
        expressed in this graph), ``kv_type`` bits per element for K and V."""
        g = self.loaded.geometry
        return LayerKVProfile(g.n_layers, 0, 0, 2 * g.n_kv_heads * g.head_dim * self._kv_bits / 8)

    # -- engine calls ----------------------------------------------------------------------------
    def _kv(self, s: Session) -> KVArrays:
        kv = read_kv(s.request, self.loaded.state_names, self.loaded.geometry)
        if kv_len(kv) != s.held.resident_count:
            raise RuntimeError(
                f"KV states hold {kv_len(kv)} entries but {s.held.resident_count} tokens are resident"
            )
        return kv

    def _set_kv(self, s: Session, kv: KVArrays) -> None:
        write_kv(s.request, self.loaded.state_names, kv)

    def _run(self, s: Session, tokens: Sequence[int], positions: Sequence[int], past: int) -> npt.NDArray[np.float32]:
        """Feed ``tokens`` at ``positions`` after ``past`` cache entries; next-token logits of the last."""
        n = len(tokens)
        out = s.request.infer({
            "input_ids": np.asarray([tokens], dtype=np.int64),
            "attention_mask": np.ones((1, past + n), dtype=np.int64),
            "position_ids": np.asarray([positions], dtype=np.int64),
            "beam_idx": np.zeros(1, dtype=np.int32),
        })
        return np.array(out["logits"][0, -1], dtype=np.float32, copy=True)

    def _defer(self, s: Session, new_map: PositionMap) -> None:
        """Adopt ``new_map`` now, bring the KV states to it at the next ``sync`` (once per plan)."""
        if s.kv_map is None:
            s.kv_map = s.positions
        s.positions = new_map

    def sync(self, session_id: str) -> None:
        """Carry out the pending changes of a session on its KV states, if any (``append``,
        ``export_range``, admission and scoring call this first). On failure the states keep what
        they held, the change stays pending, ``RecomputeError``."""
        s = self._get(session_id)
        if s.kv_map is not None:
            self._apply_pending(session_id, s)

    @staticmethod
    def _index(m: PositionMap, log_index: int) -> int:
        """State entry index of the first resident token at or after ``log_index``."""
        return int(m.resident_mask()[:log_index].sum())

    def _rotate(self, kv: KVArrays, delta: int | npt.NDArray[np.int64]) -> KVArrays:
        if np.all(np.asarray(delta) == 0):
            return kv
        rope = self.loaded.rope
        if rope is None:
            raise CapabilityError(
                f"model {self.loaded.source!r} does not record its RoPE parameters; cannot re-base keys"
            )
        return [(rotate_keys(k, delta, rope), v) for k, v in kv]

    def _valid_tokens(self, tokens: Sequence[int]) -> list[int]:
        return token_ids(tokens, self.loaded.vocab_size)

    # -- range operations ------------------------------------------------------------------------
    def append(self, session_id: str, tokens: Sequence[int]) -> npt.NDArray[np.float32]:
        s = self._get(session_id)
        toks = self._valid_tokens(tokens)
        if not toks:
            raise ValueError("append needs at least one token")
        self.sync(session_id)
        new_map = s.positions.copy()
        first = new_map.append(len(toks))
        logits = self._run(s, toks, list(range(first, first + len(toks))), s.positions.resident_count)
        s.tokens.extend(toks)
        s.positions = new_map
        return logits

    def evict_range(self, session_id: str, rng: Range, rebase: bool = False) -> None:
        s = self._get(session_id)
        s.positions.check_resident(rng)
        if rebase and not self._caps.position_shift:
            raise CapabilityError(
                f"{self.mode} mode cannot re-base the positions of model {self.loaded.source!r} "
                "(position_shift is false)"
            )
        new_map = s.positions.copy()
        new_map.evict(rng, rebase)
        self._defer(s, new_map)

    def export_range(self, session_id: str, rng: Range) -> KVBlock:
        s = self._get(session_id)
        positions = s.positions.positions(rng)
        if not s.held.resident_mask()[rng.start:rng.end].all():
            self.sync(session_id)  # admitted since the states were last rebuilt: no KV yet
        held = s.held
        idx = self._index(held, rng.start)
        part = take(self._kv(s), idx, idx + len(rng))
        moved = positions - held.all_positions()[rng.start:rng.end]
        if moved.any():  # a pending re-base: the held keys still sit at their old positions
            part = self._rotate(part, moved)
        return KVBlock(
            fingerprint=self.fingerprint, model_id=self.loaded.model_id, engine=ENGINE,
            type_k=self.kv_type, type_v=self.kv_type, geometry=self.loaded.geometry,
            session_id=session_id, token_range=rng, token_ids=tuple(s.tokens[rng.start:rng.end]),
            payload=kv_to_payload(part), positions=tuple(int(p) for p in positions),
            meta={"dtype": "float32", "layout": "layer,kv,kv_head,token,dim", "rope": "norm"},
        )

    def import_range(self, session_id: str, block: KVBlock) -> None:
        s = self._get(session_id)
        block = self._check_block(session_id, block, self.fingerprint)
        rng = block.token_range
        s.positions.check_in_log(rng)
        if len(block.positions) != len(rng):
            raise BlockMismatchError(f"block for {rng} has {len(block.positions)} positions, needs {len(rng)}")
        offsets = np.asarray(block.positions, dtype=np.int64) - block.positions[0]
        new_map = s.positions.copy()
        op = new_map.admit(rng, offsets, preferred_first=block.positions[0])
        try:
            part = payload_to_kv(block.payload, self.loaded.geometry, len(rng))
        except ValueError as exc:
            raise BlockMismatchError(f"block for {rng} of session {block.session_id!r}: {exc}") from exc
        self._place_block(session_id, s, block, part, new_map, op)

    # -- session edits ---------------------------------------------------------------------------
    def truncate(self, session_id: str, length: int) -> npt.NDArray[np.float32] | None:
        s = self._get(session_id)
        length = check_truncate_length(session_id, length, len(s.tokens))
        if length < len(s.tokens):
            self.sync(session_id)
            self._set_kv(s, take(self._kv(s), 0, int(s.positions.resident_mask()[:length].sum())))
            s.positions = truncated_positions(s.positions, length)
            del s.tokens[length:]
            s.prefill = None
            self._forget_recall(session_id)
        if not s.tokens or not s.positions.resident_mask()[-1]:
            return None
        self.sync(session_id)
        kv = self._kv(s)
        n = kv_len(kv)
        try:
            self._set_kv(s, take(kv, 0, n - 1))
            return self._run(s, s.tokens[-1:], [int(s.positions.all_positions()[-1])], n - 1)
        finally:
            self._set_kv(s, kv)

    def _forget_recall(self, session_id: str) -> None:
        """Drop what a recall kept for the session (its log changed under it)."""

    def fork_session(self, source_id: str, new_id: str) -> None:
        s = self._get(source_id)
        if new_id in self._sessions:
            raise SessionExistsError(new_id)
        self.sync(source_id)
        fork = Session(self._compiled.create_infer_request(), tokens=list(s.tokens), positions=s.positions.copy())
        self._set_kv(fork, self._kv(s))
        self._sessions[new_id] = fork

    # -- attention -------------------------------------------------------------------------------
    def attention(self, session_id: str, window: int | None = None) -> AttentionCapture:
        """Attention of the last ``window`` (default ``score_window``) resident tokens over every
        resident token, replayed over the cache before them (keys and queries labelled by
        token-log index)."""
        s = self._get(session_id)
        if not self._caps.attention_capture:
            raise CapabilityError(f"model {self.loaded.source!r} exposes no attention probabilities")
        mask = s.positions.resident_mask()
        if not mask.any():
            raise RangeError(f"session {session_id!r} has no resident tokens to score")
        self.sync(session_id)
        scoring = self._scoring_pass()
        log_index = np.nonzero(mask)[0].astype(np.int64)
        probs = scoring.attention_probs(
            self._kv(s), np.asarray(s.tokens)[mask].tolist(), s.positions.all_positions()[mask].tolist(),
            window or self.score_window,
        )
        return AttentionCapture(probs, log_index, log_index[log_index.size - probs.shape[2]:])

    def _scoring_pass(self) -> ScoringPass:
        """The scoring pass (one request, reused: its states are reset after every pass; whoever
        takes it may change them, so what a recall preparation loaded into it is forgotten)."""
        self._score_holds = None
        if self._score_pass is None:
            model, outputs = with_attention_outputs(self.loaded.model)
            self._score_compiled = ov.Core().compile_model(model, self.device, self._score_config)
            self._score_pass = ScoringPass(self._score_compiled.create_infer_request(), self.loaded.state_names,
                                           outputs)
        return self._score_pass

    def keys(self, session_id: str) -> KeyCapture:
        s = self._get(session_id)
        self.sync(session_id)
        keys = np.stack([k[0] for k, _ in self._kv(s)]).astype(np.float32)  # (layer, head, n, dim)
        return KeyCapture(keys, np.nonzero(s.positions.resident_mask())[0].astype(np.int64))
