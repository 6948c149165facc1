"""What a llama executor's arguments open: the model's KV geometry checked, one llama context
shaped as ``cache_shape`` says, the cell operations of its layout and what they can do.

Primitives:
- ``open_cache(model, model_path, n_ctx, n_seq_max, type_k, type_v, flash_attn, n_batch, n_threads,
  n_gpu_layers, swa_full, kv_layout) -> LlamaCache``: ``ValueError`` when a KV type does not fit
  the model's head dimension or a split layout is asked of a sliding-window model; the model is
  closed when the context cannot be opened.
- ``LlamaCache``: ``geometry`` (``KVGeometry``), ``ctx`` (the ``LlamaContext``), ``ops``
  (``CacheOps``; ``StreamOps`` in the split layout), ``model_id``
  (``kvres.actors.model_files.model_id``), ``fmt`` (the ``blocks.BlockFormat`` of its blocks) and
  ``caps`` (the ``Capabilities`` the executor reports).

The unified layout: one cache of ``n_ctx`` cells (and the reserved ones) over a sequence per
session, a parking sequence per session and a scratch sequence (``cache_ops``). The split layout
(``kv_layout="split"``): a stream of ``n_ctx / n_seq_max`` cells per session (and a spare one
from ``cache_shape.SPARE_STREAM_SESSIONS`` sessions on), no eviction from the middle or position
shift (``stream_ops``). A quantized K cache cannot shift (llama.cpp 0.3.36 crashes applying the
K-shift to it), nor be read as float keys; neither can a sliding-window model's blocks (they
hold two caches).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from kvres.actors.model_files import model_id, read_gguf_metadata
from kvres.coldstore.block import KVGeometry
from kvres.policy.capabilities import Capabilities
from kvres.policy.kv_types import QUANTIZED_KV_TYPES, kv_type_fits_head, kv_type_info

from .blocks import BlockFormat
from .cache_ops import CacheOps
from .cache_shape import context_request, spare_streams
from .engine import LlamaContext, LlamaModel
from .stream_ops import StreamOps


@dataclass(frozen=True)
class LlamaCache:
    geometry: KVGeometry
    ctx: LlamaContext
    ops: CacheOps | StreamOps
    model_id: str
    fmt: BlockFormat
    caps: Capabilities


def open_cache(
    model: LlamaModel, model_path: Path, *, n_ctx: int, n_seq_max: int, type_k: str, type_v: str,
    flash_attn: bool, n_batch: int, n_threads: int, n_gpu_layers: int | None, swa_full: bool, kv_layout: str,
) -> LlamaCache:
    split = kv_layout == "split"
    try:
        geometry = _geometry(model, model_path)
        _check_quantizable(model_path, geometry, type_k, type_v)
        if split and model.n_swa > 0:
            raise ValueError(f"kv_layout='split' is not for sliding-window models ({model_path.name} "
                             f"has n_swa={model.n_swa}); use kv_layout='unified'")
        cells, sequences = context_request(n_ctx, n_seq_max, kv_layout)
        ctx = LlamaContext(
            model, n_ctx=cells, n_seq_max=sequences, type_k=type_k, type_v=type_v, flash_attn=flash_attn,
            n_batch=n_batch, n_threads=n_threads, swa_full=swa_full, kv_unified=not split,
            # one-token rows of many sessions in one tile of the CPU flash-attention kernel attend
            # over all their cells; a split cache or a GPU has no such tiles
            isolate_short_items=flash_attn and not split and not n_gpu_layers,
        )
    except BaseException:
        model.close()
        raise
    filler = model.bos if model.bos >= 0 else 0
    # llama.cpp reports can_shift for quantized K caches, but applying the K-shift crashes
    can_shift = ctx.can_shift and type_k not in QUANTIZED_KV_TYPES and not split
    spare = spare_streams(kv_layout, n_seq_max)
    ops = StreamOps(ctx, n_seq_max, ctx.n_cells // (n_seq_max + spare), bool(spare)) if split \
        else CacheOps(ctx, n_seq_max, filler, can_shift)
    identity = model_id(model_path)
    n_swa = model.n_swa
    # a sliding-window model's blobs hold two caches: exported and imported whole, not read as cells
    fmt = BlockFormat(identity, type_k, type_v, geometry, flash_attn, windowed=n_swa > 0)
    caps = Capabilities(
        remove_middle=not split,
        position_shift=ops.can_shift,
        attention_capture=True,
        key_access=type_k in ("f32", "f16") and n_swa == 0,
        kv_export=True,
    )
    return LlamaCache(geometry, ctx, ops, identity, fmt, caps)


def _check_quantizable(model_path: Path, geometry: KVGeometry, type_k: str, type_v: str) -> None:
    for name, kv_type in (("type_k", type_k), ("type_v", type_v)):
        if not kv_type_fits_head(kv_type, geometry.head_dim):
            raise ValueError(
                f"{name}={kv_type!r} needs a head dimension divisible by "
                f"{kv_type_info(kv_type).block_elements}; {model_path.name} has head_dim "
                f"{geometry.head_dim}"
            )


def _geometry(model: LlamaModel, model_path: Path) -> KVGeometry:
    meta = read_gguf_metadata(model_path)
    arch = meta.get("general.architecture")
    head_dim = meta.get(f"{arch}.attention.key_length") or model.n_embd // model.n_head
    return KVGeometry(model.n_layer, model.n_head_kv, int(head_dim))
