"""The binding of llama-cpp-python's low-level API in kvres: a loaded model and a context.

Primitives:
- ``LlamaModel(path, n_gpu_layers=None, main_gpu=None)``: loads a GGUF file (``ModelLoadError`` when
  it is missing or not GGUF; ``None`` keeps llama.cpp's default layer offload / main device);
  ``path``, ``n_gpu_layers``, ``main_gpu``, ``n_vocab``,
  ``n_layer``, ``n_head``, ``n_head_kv``, ``n_embd``, ``n_swa``, ``bos``, ``can_tokenize_text``,
  ``tokenize(text, add_bos=True, parse_special=False)``, ``detokenize(tokens, render_special=False)``
  (ids checked against ``n_vocab`` first: ``TokenIdError``), ``is_eog(token)``, ``eog_ids()``,
  ``sampler_chain(parts)`` (see samplers), ``close()``;
  ``rope`` (``"norm"``, ``"neox"``, ``"none"`` or ``"other"``) and ``rope_freq_scale`` (trained).
- ``LlamaContext(model, n_ctx, n_seq_max=1, type_k="f16", type_v="f16", flash_attn=None,
  n_batch=512, n_threads=1, cb_eval=None, swa_full=True, kv_unified=True, n_ubatch=None,
  isolate_short_items=False)``: one llama context with unified KV across ``n_seq_max`` sequences
  (``flash_attn=None`` lets llama.cpp choose; KV types are ``kvres.policy.kv_types`` names;
  ``swa_full`` keeps llama.cpp's full-size sliding-window cache, ``n_ubatch=None`` means
  ``n_batch``; ``isolate_short_items``: ``decode_many`` follows ``call_groups``).
  ``decode(tokens, first_pos, seq, logits=True)``: prefill in ``n_batch`` chunks through one
  reused batch; the last token's logits (a copy) when ``logits``, else None.
  ``decode_many(items)``: several sequences in the same ``llama_decode`` calls (continuous
  batching): each item ``(tokens, first_pos, seq)`` gets the logits of its last token.
  ``call_groups(lengths)``: which items of a batch go in which ``llama_decode`` call when short
  items are kept out of a batch that llama.cpp's CPU flash attention takes in tiles.
  Memory: ``seq_rm``, ``seq_cp``, ``seq_add``, ``pos_max``, ``clear()``. State:
  ``state_get(seq) -> bytes``, ``state_set(seq, payload) -> bool``. ``n_cells``, ``n_batch``,
  ``can_shift``, ``close()``.
- samplers: ``model.sampler_chain([(name, *args), ...])``, a chain of ``llama_sampler_init_<name>``
  (``grammar`` gets the vocabulary first; one llama.cpp refuses raises ``ValueError`` with what it
  logged); ``sampler_sample(chain, data, part=None) -> id`` (-1: none) applies the chain or its
  ``part``-th sampler to ``data``, ``TOKEN_DATA`` candidates (changed in place);
  ``sampler_accept(chain, token, part=None)``, ``sampler_reset(chain, part=None)``, ``sampler_free``.

A decode uses the context's ``n_threads`` only on the one thread of the process that may
(``decode_threads``); any other decodes on one thread. llama.cpp itself is loaded, and its log
routed, by ``library``; ggml's tensor functions are ``ggml_tensors``'. Nothing here knows about
sessions or token logs.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Sequence
from typing import Any, Literal, overload

import numpy as np
import numpy.typing as npt

from kvres.actors.model_files import check_gguf_file
from kvres.policy.errors import CapabilityError, ModelLoadError
from kvres.policy.kv_types import CONFIGURABLE_KV_TYPES, KV_TYPES
from kvres.policy.tokens import token_ids

from .decode_threads import may_use_threads
from .library import captured_log, load_llama
from .llama_errors import ContextFullError, EngineError

FLASH_ATTN_TYPE = {None: -1, False: 0, True: 1}  # llama_flash_attn_type: auto, disabled, enabled


def _kv_type_id(name: str, what: str) -> int:
    if name not in CONFIGURABLE_KV_TYPES:
        raise ValueError(f"{what}={name!r} is not a supported KV type ({', '.join(CONFIGURABLE_KV_TYPES)})")
    return KV_TYPES[name].ggml_id


class LlamaModel:
    def __init__(
        self, path: str | os.PathLike[str], n_gpu_layers: int | None = None, main_gpu: int | None = None
    ) -> None:
        self.path = check_gguf_file(path)
        ll = load_llama()
        params = ll.llama_model_default_params()
        if n_gpu_layers is not None:
            params.n_gpu_layers = n_gpu_layers
        if main_gpu is not None:
            params.main_gpu = main_gpu
        self.n_gpu_layers, self.main_gpu = int(params.n_gpu_layers), int(params.main_gpu)
        self._ptr = ll.llama_model_load_from_file(os.fsencode(self.path), params)
        if not self._ptr:
            raise ModelLoadError(f"llama.cpp could not load the GGUF model {os.fspath(path)!r}")
        self._vocab = ll.llama_model_get_vocab(self._ptr)
        self.n_vocab = int(ll.llama_vocab_n_tokens(self._vocab))
        self.n_layer = int(ll.llama_model_n_layer(self._ptr))
        self.n_head = int(ll.llama_model_n_head(self._ptr))
        self.n_head_kv = int(ll.llama_model_n_head_kv(self._ptr))
        self.n_embd = int(ll.llama_model_n_embd(self._ptr))
        self.n_swa = int(ll.llama_model_n_swa(self._ptr))
        self.bos = int(ll.llama_vocab_bos(self._vocab))
        rope_kinds = {ll.LLAMA_ROPE_TYPE_NORM: "norm", ll.LLAMA_ROPE_TYPE_NEOX: "neox", ll.LLAMA_ROPE_TYPE_NONE: "none"}
        self.rope = rope_kinds.get(int(ll.llama_model_rope_type(self._ptr)), "other")
        self.rope_freq_scale = float(ll.llama_model_rope_freq_scale_train(self._ptr))
        self.can_tokenize_text = self._has_byte_fallback(ll)

    def _has_byte_fallback(self, ll: Any) -> bool:
        """A SentencePiece vocabulary without byte tokens makes llama.cpp abort the process on any
        character it cannot spell: refuse text for such models instead."""
        if int(ll.llama_vocab_type(self._vocab)) != ll.LLAMA_VOCAB_TYPE_SPM:
            return True
        byte_attr = int(ll.LLAMA_TOKEN_ATTR_BYTE)
        n_bytes = sum(
            1 for t in range(self.n_vocab) if int(ll.llama_vocab_get_attr(self._vocab, t)) & byte_attr
        )
        return n_bytes >= 256

    @property
    def ptr(self) -> Any:
        if not self._ptr:
            raise EngineError("the model has been closed")
        return self._ptr

    def close(self) -> None:
        if self._ptr:
            load_llama().llama_model_free(self._ptr)
            self._ptr = None

    def is_eog(self, token: int) -> bool:
        return bool(load_llama().llama_vocab_is_eog(self._vocab, int(token)))

    def tokenize(self, text: str, add_bos: bool = True, parse_special: bool = False) -> list[int]:
        if not self.can_tokenize_text:
            raise CapabilityError(
                f"model {str(self.path)!r} has a SentencePiece vocabulary without byte-fallback tokens: "
                "llama.cpp cannot tokenize arbitrary text with it; pass token ids instead"
            )
        ll = load_llama()
        raw = text.encode("utf-8")
        cap = len(raw) + 8
        buf = (ll.llama_token * cap)()
        n = ll.llama_tokenize(self._vocab, raw, len(raw), buf, cap, add_bos, parse_special)
        if n < 0:
            cap = -n
            buf = (ll.llama_token * cap)()
            n = ll.llama_tokenize(self._vocab, raw, len(raw), buf, cap, add_bos, parse_special)
        if n < 0:
            raise EngineError(f"llama_tokenize failed on {len(raw)} bytes of text")
        return [int(t) for t in buf[:n]]

    def detokenize(self, tokens: Sequence[int], render_special: bool = False) -> str:
        tokens = token_ids(tokens, self.n_vocab)  # llama.cpp aborts the process on an unknown id
        ll = load_llama()
        # numpy fills the id array in C: a ctypes array built from a list costs ~15x llama_detokenize
        # itself, and a chat turn detokenizes its whole conversation a few times
        held = np.array(tokens if tokens else [0], dtype=np.int32)
        ids = held.ctypes.data_as(ctypes.POINTER(ll.llama_token))
        cap = 8 * len(tokens) + 16
        for _ in range(2):
            out = ctypes.create_string_buffer(cap)
            n = ll.llama_detokenize(self._vocab, ids, len(tokens), out, cap, False, render_special)
            if n >= 0:
                return out.raw[:n].decode("utf-8", "replace")
            cap = -n
        raise EngineError(f"llama_detokenize failed on {len(tokens)} tokens")

    def eog_ids(self) -> frozenset[int]:
        ll = load_llama()
        return frozenset(t for t in range(self.n_vocab) if ll.llama_vocab_is_eog(self._vocab, t))

    def sampler_chain(self, parts: Sequence[tuple[Any, ...]]) -> Any:
        ll = load_llama()
        chain = ll.llama_sampler_chain_init(ll.llama_sampler_chain_default_params())
        for name, *args in parts:
            with captured_log() as lines:
                part = getattr(ll, f"llama_sampler_init_{name}")(*([self._vocab] if name == "grammar" else []), *args)
            if not part:
                ll.llama_sampler_free(chain)
                raise ValueError(f"llama.cpp refused the {name} sampler: {' '.join(lines) or 'it gave no reason'}")
            ll.llama_sampler_chain_add(chain, part)
        return chain


TOKEN_DATA = np.dtype([("id", np.int32), ("logit", np.float32), ("p", np.float32)])  # llama_token_data


def _part(chain: Any, part: int | None) -> Any:
    return chain if part is None else load_llama().llama_sampler_chain_get(chain, part)


def sampler_sample(chain: Any, data: npt.NDArray[np.void], part: int | None = None) -> int:
    ll = load_llama()
    arr = ll.llama_token_data_array(data.ctypes.data_as(ll.llama_token_data_p), data.shape[0], -1, False)
    ll.llama_sampler_apply(_part(chain, part), ctypes.byref(arr))
    return int(arr.data[arr.selected].id) if 0 <= arr.selected < arr.size else -1


def sampler_accept(chain: Any, token: int, part: int | None = None) -> None:
    load_llama().llama_sampler_accept(_part(chain, part), int(token))


def sampler_reset(chain: Any, part: int | None = None) -> None:
    load_llama().llama_sampler_reset(_part(chain, part))


def sampler_free(chain: Any) -> None:
    load_llama().llama_sampler_free(chain)


TILED_ATTENTION_ROWS = 64  # a llama_decode of more tokens runs the CPU flash-attention kernel in tiles of query rows
SHORT_ITEM_TOKENS = 16  # an item this short (a decode step's token) shares its tile with other sessions' rows


def call_groups(lengths: Sequence[int]) -> list[list[int]]:
    """The ``llama_decode`` calls a batch of items of these token counts goes in (item indices).

    Past ``TILED_ATTENTION_ROWS`` tokens llama.cpp's CPU flash attention takes query rows in tiles
    and skips only the KV cells masked for every row of a tile; a tile holding the one-token rows of
    several sessions attends over all their cells of the unified cache (a step of one 100-token
    prompt and 5 decodes: 147 ms in one call, 98 ms in two, at 12 layers / hidden 768 / 8 resident
    sessions of 450 tokens, docs/notes.md). So when the whole batch is past that size, the short
    items go in calls of their own of at most that many tokens (each of which reads the weights
    once more: below the size one call is cheaper), the rest together."""
    if sum(lengths) <= TILED_ATTENTION_ROWS:
        return [list(range(len(lengths)))]
    short = [i for i, n in enumerate(lengths) if n < SHORT_ITEM_TOKENS]
    long = [i for i, n in enumerate(lengths) if n >= SHORT_ITEM_TOKENS]
    if not short or not long:
        return [list(range(len(lengths)))]
    groups: list[list[int]] = [[]]
    size = 0
    for i in short:
        if size + lengths[i] > TILED_ATTENTION_ROWS and groups[-1]:
            groups.append([])
            size = 0
        groups[-1].append(i)
        size += lengths[i]
    return [*groups, long]


class _Batch:
    """One ``llama_batch`` whose arrays are numpy buffers owned here (one sequence per token)."""

    def __init__(self, ll: Any, capacity: int) -> None:
        self.capacity = capacity
        self.token = np.zeros(capacity, dtype=np.int32)
        self.pos = np.zeros(capacity, dtype=np.int32)
        self.n_seq_id = np.ones(capacity, dtype=np.int32)
        self.seq = np.zeros(capacity, dtype=np.int32)
        self.logits = np.zeros(capacity, dtype=np.int8)
        seq_base = self.seq.ctypes.data
        self._seq_ptrs = (ctypes.POINTER(ll.llama_seq_id) * capacity)(
            *[ctypes.cast(seq_base + 4 * i, ctypes.POINTER(ll.llama_seq_id)) for i in range(capacity)]
        )
        self.struct = ll.llama_batch()
        self.struct.token = self.token.ctypes.data_as(ctypes.POINTER(ll.llama_token))
        self.struct.embd = None
        self.struct.pos = self.pos.ctypes.data_as(ctypes.POINTER(ll.llama_pos))
        self.struct.n_seq_id = self.n_seq_id.ctypes.data_as(ctypes.POINTER(ctypes.c_int32))
        self.struct.seq_id = ctypes.cast(self._seq_ptrs, ctypes.POINTER(ctypes.POINTER(ll.llama_seq_id)))
        self.struct.logits = self.logits.ctypes.data_as(ctypes.POINTER(ctypes.c_int8))

    def fill_many(self, tokens: npt.NDArray[np.int32], pos: npt.NDArray[np.int32], seq: npt.NDArray[np.int32],
                  want: npt.NDArray[np.int8]) -> None:
        n = tokens.shape[0]
        self.token[:n] = tokens
        self.pos[:n] = pos
        self.seq[:n] = seq
        self.logits[:n] = want
        self.struct.n_tokens = n

    def fill(self, tokens: npt.NDArray[np.int32], first_pos: int, seq: int, want_last: bool) -> None:
        n = tokens.shape[0]
        self.token[:n] = tokens
        self.pos[:n] = np.arange(first_pos, first_pos + n, dtype=np.int32)
        self.seq[:n] = seq
        self.logits[:n] = 0
        self.logits[n - 1] = 1 if want_last else 0
        self.struct.n_tokens = n


_bytes_of_size = ctypes.pythonapi.PyBytes_FromStringAndSize
_bytes_of_size.restype = ctypes.py_object
_bytes_of_size.argtypes = (ctypes.c_void_p, ctypes.c_ssize_t)


def _uninitialised_bytes(size: int) -> bytes:
    """A new ``bytes`` of ``size`` whose contents are not set yet, for llama.cpp to write into
    before anything else sees it (``PyBytes_FromStringAndSize(NULL, size)``, as C extensions do)."""
    out: bytes = _bytes_of_size(None, size)
    return out


def _payload_pointer(payload: bytes | bytearray | memoryview) -> tuple[Any, int]:
    """A ``uint8 *`` over the payload's own bytes (never a copy) and its size. A read-only buffer
    (a block mapped from Ray's object store) is only ever read through it (``state_set``): copying
    it first cost a page fault per page of fresh memory on every resume."""
    if isinstance(payload, bytes):
        return ctypes.cast(ctypes.c_char_p(payload), ctypes.POINTER(ctypes.c_uint8)), len(payload)
    view = memoryview(payload).cast("B")
    if view.readonly:  # the pointer keeps the array, and so the buffer, alive
        return np.frombuffer(view, dtype=np.uint8).ctypes.data_as(ctypes.POINTER(ctypes.c_uint8)), view.nbytes
    return (ctypes.c_uint8 * view.nbytes).from_buffer(view), view.nbytes


class LlamaContext:
    def __init__(
        self,
        model: LlamaModel,
        n_ctx: int,
        n_seq_max: int = 1,
        type_k: str = "f16",
        type_v: str = "f16",
        flash_attn: bool | None = None,
        n_batch: int = 512,
        n_threads: int = 1,
        cb_eval: Any = None,
        swa_full: bool = True,
        kv_unified: bool = True,
        n_ubatch: int | None = None,
        isolate_short_items: bool = False,
    ) -> None:
        ll = load_llama()
        self.model = model
        self.isolate_short_items = isolate_short_items
        params = ll.llama_context_default_params()
        params.n_ctx = n_ctx
        params.n_batch = n_batch
        params.n_ubatch = n_batch if n_ubatch is None else n_ubatch
        params.n_seq_max = n_seq_max
        params.kv_unified = kv_unified
        params.swa_full = swa_full
        params.n_threads = n_threads
        params.n_threads_batch = n_threads
        self.n_threads = n_threads
        params.flash_attn_type = FLASH_ATTN_TYPE[flash_attn]
        params.type_k = _kv_type_id(type_k, "type_k")
        params.type_v = _kv_type_id(type_v, "type_v")
        params.no_perf = True
        if cb_eval is not None:
            params.cb_eval = cb_eval
            params.cb_eval_user_data = None
        self._cb_eval = cb_eval  # the ctypes callback must live as long as the context
        self._ptr = ll.llama_init_from_model(model.ptr, params)
        if not self._ptr:
            raise EngineError(
                f"llama.cpp could not create a context (n_ctx={n_ctx}, n_seq_max={n_seq_max}, "
                f"type_k={type_k}, type_v={type_v}, flash_attn={flash_attn})"
            )
        self._mem = ll.llama_get_memory(self._ptr)
        self.n_cells = int(ll.llama_n_ctx(self._ptr))
        self.n_batch = int(ll.llama_n_batch(self._ptr))
        self.can_shift = bool(ll.llama_memory_can_shift(self._mem))
        self._batch = _Batch(ll, self.n_batch)

    @property
    def ptr(self) -> Any:
        if not self._ptr:
            raise EngineError("the engine context has been closed")
        return self._ptr

    def close(self) -> None:
        if self._ptr:
            load_llama().llama_free(self._ptr)
            self._ptr = None

    # -- decoding -------------------------------------------------------------------------
    def _llama_decode(self, ll: Any) -> int:
        if self.n_threads <= 1 or may_use_threads():
            return int(ll.llama_decode(self.ptr, self._batch.struct))
        ll.llama_set_n_threads(self.ptr, 1, 1)
        try:
            return int(ll.llama_decode(self.ptr, self._batch.struct))
        finally:
            ll.llama_set_n_threads(self.ptr, self.n_threads, self.n_threads)

    @overload
    def decode(
        self, tokens: Sequence[int], first_pos: int, seq: int, logits: Literal[True] = ...
    ) -> npt.NDArray[np.float32]: ...

    @overload
    def decode(self, tokens: Sequence[int], first_pos: int, seq: int, logits: Literal[False]) -> None: ...

    def decode(
        self, tokens: Sequence[int], first_pos: int, seq: int, logits: bool = True
    ) -> npt.NDArray[np.float32] | None:
        """Decode ``tokens`` into ``seq`` at positions ``first_pos..``, ``n_batch`` per call.

        Returns the last token's logits (a copy) when ``logits``. On failure the tokens this
        call placed are removed again, so the sequence is as it was.
        """
        ll = load_llama()
        arr = np.asarray(tokens, dtype=np.int32)
        n = arr.shape[0]
        for start in range(0, n, self.n_batch):
            chunk = arr[start : start + self.n_batch]
            last = start + chunk.shape[0] == n
            self._batch.fill(chunk, first_pos + start, seq, want_last=logits and last)
            rc = self._llama_decode(ll)
            if rc != 0:
                ll.llama_memory_seq_rm(self._mem, seq, first_pos, first_pos + n)
                if rc == 1:
                    raise ContextFullError(
                        f"no free KV cells for {chunk.shape[0]} tokens of sequence {seq} "
                        f"(context of {self.n_cells} cells)",
                        needed=int(chunk.shape[0]),
                    )
                raise EngineError(f"llama_decode returned {rc} for sequence {seq} at position "
                                  f"{first_pos + start}")
        if not logits:
            return None
        ptr = ll.llama_get_logits_ith(self.ptr, -1)
        return np.ctypeslib.as_array(ptr, shape=(self.model.n_vocab,)).astype(np.float32, copy=True)

    def decode_many(
        self, items: Sequence[tuple[Sequence[int], int, int]], silent: Sequence[bool] | None = None,
    ) -> list[npt.NDArray[np.float32]]:
        """Decode every item's tokens (``(tokens, first_pos, seq)``, one sequence per item) in
        shared batches of up to ``n_batch`` tokens; return each item's last-token logits (an empty
        array for the items ``silent`` marks: they compute none).

        With ``isolate_short_items``, a batch past ``TILED_ATTENTION_ROWS`` tokens leaves its short
        items (decodes) to a ``llama_decode`` of their own (``call_groups``). On failure every
        token this call placed is removed again, so each sequence is as it was.
        """
        out: list[npt.NDArray[np.float32]] = [np.zeros(0, dtype=np.float32)] * len(items)
        groups = call_groups([len(t) for t, _, _ in items]) if self.isolate_short_items else [list(range(len(items)))]
        wanted = [True] * len(items) if silent is None else [not quiet for quiet in silent]
        try:
            for group in groups:
                answers = self._decode_together([items[i] for i in group], [wanted[i] for i in group])
                for i, logits in zip(group, answers, strict=True):
                    out[i] = logits
        except (ContextFullError, EngineError):
            ll = load_llama()
            for t, p, s in items:
                ll.llama_memory_seq_rm(self._mem, s, p, p + len(t))
            raise
        return out

    def _decode_together(self, items: Sequence[tuple[Sequence[int], int, int]],
                         wanted: Sequence[bool]) -> list[npt.NDArray[np.float32]]:
        ll = load_llama()
        tokens = np.concatenate([np.asarray(t, dtype=np.int32) for t, _, _ in items])
        pos = np.concatenate([np.arange(p, p + len(t), dtype=np.int32) for t, p, _ in items])
        seqs = np.concatenate([np.full(len(t), s, dtype=np.int32) for t, _, s in items])
        asked = np.flatnonzero(wanted)  # the items whose logits come back, in batch order
        ends = (np.cumsum([len(t) for t, _, _ in items]) - 1)[asked]  # flat index of each one's last token
        want = np.zeros(tokens.shape[0], dtype=np.int8)
        want[ends] = 1
        out: list[npt.NDArray[np.float32]] = [np.zeros(0, dtype=np.float32)] * len(items)
        n_vocab = self.model.n_vocab
        item = 0
        for start in range(0, tokens.shape[0], self.n_batch):
            stop = min(start + self.n_batch, tokens.shape[0])
            self._batch.fill_many(tokens[start:stop], pos[start:stop], seqs[start:stop], want[start:stop])
            rc = self._llama_decode(ll)
            if rc != 0:
                if rc == 1:
                    raise ContextFullError(
                        f"no free KV cells for a batch of {stop - start} tokens over {len(items)} sequences "
                        f"(context of {self.n_cells} cells)", needed=stop - start,
                    )
                raise EngineError(f"llama_decode returned {rc} for a batch of {len(items)} sequences")
            # this batch's outputs, one row per asked item that ends in it, in batch order
            first, item = item, int(np.searchsorted(ends, stop))
            if item > first:
                rows = np.ctypeslib.as_array(ll.llama_get_logits(self.ptr), shape=(item - first, n_vocab)).copy()
                for k, row in zip(asked[first:item], rows, strict=True):
                    out[k] = row
        return out

    # -- memory ---------------------------------------------------------------------------
    def seq_rm(self, seq: int, p0: int, p1: int) -> None:
        if not load_llama().llama_memory_seq_rm(self._mem, seq, p0, p1):
            raise EngineError(f"llama_memory_seq_rm refused to remove [{p0}, {p1}) of sequence {seq}")

    def seq_cp(self, src: int, dst: int, p0: int, p1: int) -> None:
        load_llama().llama_memory_seq_cp(self._mem, src, dst, p0, p1)

    def seq_add(self, seq: int, p0: int, p1: int, delta: int) -> None:
        load_llama().llama_memory_seq_add(self._mem, seq, p0, p1, delta)

    def pos_max(self, seq: int) -> int:
        return int(load_llama().llama_memory_seq_pos_max(self._mem, seq))

    def clear(self) -> None:
        load_llama().llama_memory_clear(self._mem, False)

    # -- state ----------------------------------------------------------------------------
    def state_get(self, seq: int) -> bytes:
        """The sequence's serialised state, written by llama.cpp straight into the bytes returned
        (no zero-filled buffer, no copy after: a 2,000-token state of a 12-layer model is ~24 MB)."""
        ll = load_llama()
        size = int(ll.llama_state_seq_get_size(self.ptr, seq))
        out = _uninitialised_bytes(size)
        written = int(ll.llama_state_seq_get_data(self.ptr, _payload_pointer(out)[0], size, seq))
        if written <= 0:
            raise EngineError(f"llama_state_seq_get_data wrote nothing for sequence {seq}")
        return out if written == size else out[:written]

    def state_set(self, seq: int, payload: bytes | bytearray | memoryview) -> bool:
        buf, size = _payload_pointer(payload)
        return int(load_llama().llama_state_seq_set_data(self.ptr, buf, size, seq)) > 0
