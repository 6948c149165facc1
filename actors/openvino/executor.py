"""The OpenVINO executor: the executor protocol over a stateful LLM IR, one infer request per session.

Primitives:
- ``OpenVINOExecutor(model_path, mode="state"|"recompute", cold_store=None, device="CPU",
  precision="f32", num_threads=1, score_window=16, score_kernel=7)``: ``capabilities``, ``open_session``,
  ``append``, ``token_log``, ``resident_ranges``, ``cache_positions``, ``evict_range``,
  ``admit_range``, ``export_range``, ``import_range``, ``recall_range``,
  ``block_attention_scores``, ``sync``, ``close_session``, ``sessions``, ``tokenize``,
  ``detokenize``, ``kv_profile``; attributes ``fingerprint``, ``kv_type``, ``mode``, ``loaded``.
- ``RecomputeError``: an engine call that recomputes KV failed; the token log and the KV the
  states held are as before (a deferred change stays pending, see ``sync``).

Mechanisms (positions always come from ``kvres.policy.positions.PositionMap``; state entry i is the
i-th resident token in log order, so the cache is ordered by position and the graph's causal mask
by index is causal by position). Evictions are recorded at once and carried out on the states at
the next ``sync`` (called by ``append``, export, admission and scoring), so a plan of many
evictions touches the states once:
- ``mode="state"``: the sync slices the KV states by name and re-bases the kept keys by a numpy
  RoPE rotation (``rope.rotate_keys``), each by how far it moved. Admitting recomputes only the
  admitted tokens over the resident prefix before them and splices them in, the tail keeping its
  KV (rotated if it had to move up); importing splices the block's KV in, rotated to its place.
- ``mode="recompute"`` (the seed design, what a KV-opaque engine such as openvino-genai allows):
  evicting exports the block to the attached cold store; the sync rebuilds the cache by
  re-prefilling the resident tokens at their positions; admitting and importing rebuild the same
  way (import checks the block; ``recall_range`` fetches it back by the key ``put`` returned).
  remove_middle / position_shift are advertised only with a cold store attached; without one only
  tail removal is possible and the planner degrades to a no-op with a diagnostic.
Both modes export the same payload (float32 ``[layer, k|v, kv_head, token, dim]``), so blocks move
between them; the fingerprint binds model id, engine, KV precision and geometry. Attention scores
come from an explicit scoring pass over an attention-exposing clone of the graph (``scoring_pass``).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import openvino as ov

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
from kvres.policy.positions import PositionMap
from kvres.policy.ranges import Range
from kvres.policy.scoring import block_scores, pool_1d

from ..session_table import SessionTable
from .model import LoadedModel, load_model
from .parking import has_parking
from .rope import rotate_keys
from .scoring_pass import score_keys, with_attention_outputs
from .states import KVArrays, concat, kv_len, kv_to_payload, payload_to_kv, read_kv, take, write_kv
from .text import TextCodec

ENGINE = "openvino"
MODES = ("state", "recompute")
PRECISIONS = ("f32", "default")



class RecomputeError(KvresError, RuntimeError):
    """Re-prefilling a session's resident tokens failed; the session was restored unchanged."""


@dataclass
class _Session:
    request: ov.InferRequest
    tokens: list[int] = field(default_factory=list)
    positions: PositionMap = field(default_factory=PositionMap)
    parked: dict[Range, Any] = field(default_factory=dict)
    # recompute mode: the residency the KV states still hold while a re-prefill is pending
    kv_map: PositionMap | None = None

    @property
    def held(self) -> PositionMap:
        """The map the KV states correspond to (entry i = i-th resident token of this map)."""
        return self.kv_map if self.kv_map is not None else self.positions


_COMPILED: dict[tuple[str, str, str, int], tuple[LoadedModel, ov.CompiledModel]] = {}


def _compile(model_path: Path, device: str, precision: str, num_threads: int) -> tuple[LoadedModel, ov.CompiledModel]:
    stat = model_path.stat() if model_path.is_file() else None
    key = (f"{model_path.resolve()}@{stat.st_mtime_ns if stat else 0}", device, precision, num_threads)
    if key not in _COMPILED:
        loaded = load_model(model_path)
        config: dict[str, Any] = {"INFERENCE_NUM_THREADS": num_threads, "NUM_STREAMS": 1}
        if precision == "f32":
            config |= {"INFERENCE_PRECISION_HINT": "f32", "KV_CACHE_PRECISION": "f32"}
        compiled = ov.Core().compile_model(loaded.model, device, config)
        _COMPILED[key] = (loaded, compiled)
    return _COMPILED[key]


def _kv_type_name(compiled: ov.CompiledModel, precision: str) -> str:
    """The KV precision the plugin really uses (``f32``, ``f16``, ``u8``...), for the fingerprint."""
    try:
        return str(compiled.get_property("KV_CACHE_PRECISION").to_string())
    except (RuntimeError, AttributeError):
        return precision


class OpenVINOExecutor(SessionTable):
    engine = ENGINE

    def __init__(
        self,
        model_path: str | os.PathLike[str],
        mode: str = "state",
        cold_store: Any = None,
        device: str = "CPU",
        precision: str = "f32",
        num_threads: int = 1,
        score_window: int = 16,
        score_kernel: int = 7,
    ) -> None:
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        if precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
        if cold_store is not None and not has_parking(cold_store):
            raise TypeError(f"cold_store {cold_store!r} needs put(block) and get(key) methods")
        if score_window < 1:
            raise ValueError(f"score_window must be >= 1, got {score_window}")
        if score_kernel < 1 or score_kernel % 2 == 0:
            raise ValueError(f"score_kernel must be odd and >= 1, got {score_kernel}")
        self.mode = mode
        self.score_kernel = score_kernel
        self.cold_store = cold_store
        self.score_window = score_window
        self.device = device
        self.loaded, self._compiled = _compile(Path(model_path), device, precision, num_threads)
        self._score_compiled: ov.CompiledModel | None = None
        self._score_outputs: list[str] = []
        self._score_config = {"INFERENCE_NUM_THREADS": num_threads, "NUM_STREAMS": 1}
        if precision == "f32":
            self._score_config |= {"INFERENCE_PRECISION_HINT": "f32", "KV_CACHE_PRECISION": "f32"}
        self.kv_type = _kv_type_name(self._compiled, precision)
        self.fingerprint = make_fingerprint(
            self.loaded.model_id, ENGINE, self.kv_type, self.kv_type, self.loaded.geometry
        )
        self._sessions: dict[str, _Session] = {}
        self._codec: TextCodec | None = None
        self._caps = self._capabilities()

    # -- capabilities --------------------------------------------------------------------------
    def _capabilities(self) -> Capabilities:
        rope_known = self.loaded.rope is not None
        parked = self.cold_store is not None
        if self.mode == "state":
            middle, shift = True, rope_known
        else:
            middle, shift = parked, parked
        return Capabilities(
            remove_tail=True,
            remove_middle=middle,
            position_shift=shift,
            cold_store=parked,
            recompute_range=True,
            attention_scores=self.loaded.has_attention_probs,
            kv_export=True,
        )

    def capabilities(self) -> Capabilities:
        return self._caps

    # -- sessions ------------------------------------------------------------------------------
    def open_session(self, session_id: str, tokens: Sequence[int] = ()) -> None:
        """Open a session; ``tokens`` become its token log with no KV resident (a restored session)."""
        if session_id in self._sessions:
            raise SessionExistsError(session_id)
        toks = self._valid_tokens(tokens)
        s = _Session(self._compiled.create_infer_request(), tokens=toks)
        s.positions.extend_evicted(len(toks))
        self._sessions[session_id] = s

    def close_session(self, session_id: str) -> None:
        self._get(session_id)
        del self._sessions[session_id]

    # -- text ----------------------------------------------------------------------------------
    def _text(self) -> TextCodec:
        if self._codec is None:
            meta = self.loaded.tokenizer_meta
            if meta is not None:
                self._codec = TextCodec.from_gguf_meta(meta)
            else:
                self._codec = TextCodec.from_dir(Path(self.loaded.source).parent)
        return self._codec

    def tokenize(self, text: str, add_bos: bool = True) -> list[int]:
        return self._text().tokenize(text, add_bos)

    def kv_profile(self) -> LayerKVProfile:
        """KV bytes per token from the IR's KV states: every layer global (no sliding window is
        expressed in this graph), ``kv_type`` bytes per element for K and V."""
        g = self.loaded.geometry
        elem = {"f32": 4, "f16": 2, "bf16": 2, "u8": 1, "i8": 1, "u4": 0.5}.get(self.kv_type, 4)
        return LayerKVProfile(g.n_layers, 0, 0, 2 * g.n_kv_heads * g.head_dim * elem)

    def detokenize(self, tokens: Sequence[int]) -> str:
        return self._text().detokenize(tokens)

    # -- engine calls --------------------------------------------------------------------------
    def _kv(self, s: _Session) -> KVArrays:
        kv = read_kv(s.request, self.loaded.state_names, self.loaded.geometry)
        if kv_len(kv) != s.held.resident_count:
            raise RuntimeError(
                f"KV states hold {kv_len(kv)} entries but {s.held.resident_count} tokens are resident"
            )
        return kv

    def _set_kv(self, s: _Session, kv: KVArrays) -> None:
        write_kv(s.request, self.loaded.state_names, kv)

    def _run(self, s: _Session, tokens: Sequence[int], positions: Sequence[int], past: int) -> npt.NDArray[np.float32]:
        """Feed ``tokens`` at ``positions`` after ``past`` cache entries; next-token logits of the last."""
        n = len(tokens)
        out = s.request.infer({
            "input_ids": np.asarray([tokens], dtype=np.int64),
            "attention_mask": np.ones((1, past + n), dtype=np.int64),
            "position_ids": np.asarray([positions], dtype=np.int64),
            "beam_idx": np.zeros(1, dtype=np.int32),
        })
        return np.array(out["logits"][0, -1], dtype=np.float32, copy=True)

    def _defer(self, s: _Session, new_map: PositionMap) -> None:
        """Adopt ``new_map`` now, bring the KV states to it at the next ``sync`` (once per plan)."""
        if s.kv_map is None:
            s.kv_map = s.positions
        s.positions = new_map

    def sync(self, session_id: str) -> None:
        """Make the KV states hold exactly the resident tokens at their positions, if changes are
        pending (``append``, ``export_range``, admission and scoring call this first). State mode
        keeps the still-resident entries and rotates their keys by how far each moved (one slice
        and one rotation for a whole plan); recompute mode re-prefills every resident token. On
        failure the states keep what they held, the change stays pending, ``RecomputeError``."""
        s = self._get(session_id)
        if s.kv_map is None:
            return
        if self.mode == "state":
            self._sync_by_slicing(s)
            return
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

    def _sync_by_slicing(self, s: _Session) -> None:
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
        toks = [int(t) for t in tokens]
        bad = [t for t in toks if not 0 <= t < self.loaded.vocab_size]
        if bad:
            raise ValueError(f"token id {bad[0]} is outside the vocabulary of {self.loaded.vocab_size}")
        return toks

    # -- protocol ------------------------------------------------------------------------------
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

    def _check_removal(self, s: _Session, rng: Range, rebase: bool) -> None:
        if rebase and not self._caps.position_shift:
            raise CapabilityError(
                f"{self.mode} mode cannot re-base positions here (position_shift is false"
                + (": attach a cold store" if self.mode == "recompute" else "") + ")"
            )
        is_tail = not s.positions.resident_mask()[rng.end:].any()
        if not is_tail and not self._caps.remove_middle:
            raise CapabilityError(
                f"{self.mode} mode cannot evict {rng} from the middle without a cold store "
                "(remove_middle is false)"
            )

    def evict_range(self, session_id: str, rng: Range, rebase: bool = False) -> None:
        s = self._get(session_id)
        s.positions.check_resident(rng)
        self._check_removal(s, rng, rebase)
        new_map = s.positions.copy()
        new_map.evict(rng, rebase)
        if self.mode == "recompute" and self.cold_store is not None:
            s.parked[rng] = self.cold_store.put(self.export_range(session_id, rng))
        self._defer(s, new_map)

    def admit_range(self, session_id: str, rng: Range) -> None:
        s = self._get(session_id)
        new_map = s.positions.copy()
        op = new_map.admit(rng)
        if self.mode == "recompute":
            self._defer(s, new_map)
            return
        self.sync(session_id)
        self._splice_recomputed(session_id, s, rng, op.tail_shift, list(op.positions))
        s.positions = new_map

    def _splice_recomputed(
        self, session_id: str, s: _Session, rng: Range, tail_shift: int, positions: list[int]
    ) -> None:
        kv = self._kv(s)
        idx = self._index(s.positions, rng.start)
        head, tail = take(kv, 0, idx), self._rotate(take(kv, idx), tail_shift)
        try:
            self._set_kv(s, head)
            self._run(s, s.tokens[rng.start:rng.end], positions, idx)
            fresh = take(read_kv(s.request, self.loaded.state_names, self.loaded.geometry), idx)
            self._set_kv(s, concat(head, fresh, tail))
        except Exception as exc:
            self._set_kv(s, kv)
            raise RecomputeError(f"recomputing {rng} of session {session_id!r} failed: {exc}") from exc

    def export_range(self, session_id: str, rng: Range) -> KVBlock:
        s = self._get(session_id)
        positions = s.positions.positions(rng)
        held = s.held
        if not held.resident_mask()[rng.start:rng.end].all():
            self.sync(session_id)  # admitted since the last re-prefill: no KV yet
            held = s.held
        idx = self._index(held, rng.start)
        part = take(self._kv(s), idx, idx + len(rng))
        moved = positions - held.all_positions()[rng.start:rng.end]
        if moved.any():  # a pending re-base: the held keys still sit at their old positions
            part = self._rotate(part, moved)
        g = self.loaded.geometry
        return KVBlock(
            fingerprint=self.fingerprint, model_id=self.loaded.model_id, engine=ENGINE,
            type_k=self.kv_type, type_v=self.kv_type, geometry=g, session_id=session_id,
            token_range=rng, token_ids=tuple(s.tokens[rng.start:rng.end]),
            payload=kv_to_payload(part), positions=tuple(int(p) for p in positions),
            meta={"dtype": "float32", "layout": "layer,kv,kv_head,token,dim", "rope": "norm"},
        )

    def _check_block(self, session_id: str, s: _Session, block: Any) -> None:
        if not isinstance(block, KVBlock):
            raise BlockMismatchError(f"expected a KVBlock, got {type(block).__name__} {block!r:.80}")
        block.check_fingerprint(self.fingerprint)
        rng = block.token_range
        s.positions.check_in_log(rng)
        self._check_block_tokens(session_id, block)
        if len(block.positions) != len(rng):
            raise BlockMismatchError(f"block for {rng} has {len(block.positions)} positions, needs {len(rng)}")

    def import_range(self, session_id: str, block: KVBlock) -> None:
        s = self._get(session_id)
        self._check_block(session_id, s, block)
        rng = block.token_range
        offsets = np.asarray(block.positions, dtype=np.int64) - block.positions[0]
        new_map = s.positions.copy()
        op = new_map.admit(rng, offsets, preferred_first=block.positions[0])
        try:
            part = payload_to_kv(block.payload, self.loaded.geometry, len(rng))
        except ValueError as exc:
            raise BlockMismatchError(f"block for {rng} of session {block.session_id!r}: {exc}") from exc
        if self.mode == "recompute":  # the block is checked; its KV comes back by re-prefill
            self._defer(s, new_map)
        else:
            self.sync(session_id)
            kv = self._kv(s)
            idx = self._index(s.positions, rng.start)
            head, tail = take(kv, 0, idx), self._rotate(take(kv, idx), op.tail_shift)
            part = self._rotate(part, op.positions[0] - block.positions[0])
            self._set_kv(s, concat(head, part, tail))
            s.positions = new_map
        s.parked.pop(rng, None)

    def recall_range(self, session_id: str, rng: Range) -> None:
        """Bring back a range this executor parked in its cold store when it evicted it."""
        s = self._get(session_id)
        if self.cold_store is None or rng not in s.parked:
            raise RangeError(f"range {rng} of session {session_id!r} was not parked in a cold store")
        self.import_range(session_id, self.cold_store.get(s.parked[rng]))

    def block_attention_scores(
        self, session_id: str, ranges: Sequence[Range], window: int | None = None
    ) -> list[float]:
        """SnapKV scores, computed as llama's are: attention from the last ``window`` (default
        ``score_window``) resident tokens, summed over layers, heads and query rows, max-pooled
        over ``score_kernel`` keys, summed per range."""
        s = self._get(session_id)
        for rng in ranges:
            s.positions.check_resident(rng)
        if not self._caps.attention_scores:
            raise CapabilityError(f"model {self.loaded.source!r} exposes no attention probabilities")
        self.sync(session_id)
        if self._score_compiled is None:
            model, self._score_outputs = with_attention_outputs(self.loaded.model)
            self._score_compiled = ov.Core().compile_model(model, self.device, self._score_config)
        mask = s.positions.resident_mask()
        log_index = np.nonzero(mask)[0]
        mass = score_keys(
            self._score_compiled.create_infer_request(), self.loaded.state_names, self._score_outputs,
            self._kv(s), np.asarray(s.tokens)[mask].tolist(), s.positions.all_positions()[mask].tolist(),
            window or self.score_window,
        )
        pooled = pool_1d(mass, self.score_kernel, "max")
        return [float(x) for x in block_scores(pooled, log_index, list(ranges))]
