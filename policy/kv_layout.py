"""Per-layer KV layouts as llama.cpp builds them (llama-cpp-python 0.3.36's vendored llama.cpp).

Primitives:
- ``LayerKV(k_width, v_width, windowed)``: one layer that owns a KV cache; widths are elements per
  token (``n_head_kv * head_dim``), 0 when the layer stores no V (MLA keeps K only).
- ``ModelKVLayout``: ``arch``, ``n_layer``, ``layers`` (only those owning KV), ``window``,
  ``chunked``, ``shared_layers`` (reuse another layer's KV), ``recurrent_layers`` (no KV cache),
  ``source`` (where the windowed layers came from); ``global_layers``, ``windowed_layers``,
  ``profile(type_k, type_v, cells=None)`` prices it as a ``kvres.policy.capacity.LayerKVProfile``.
  ``ModelKVLayout.uniform(...)`` builds one by counts (synthetic models).
- ``layout_from_metadata(meta)``: the layout from GGUF-style metadata (``<arch>.*`` keys);
  ``profile_from_metadata(meta, type_k, type_v)`` its session-level ``LayerKVProfile`` (reading the
  file is ``kvres.actors.model_files``' job).
- ``swa_pattern(n_layer, n_pattern, dense_first=False)``: llama.cpp's ``set_swa_pattern``.
- ``SwaRule`` and ``SWA_RULES``: what each llama.cpp loader does with sliding windows.
- ``CacheCells(n_seq_max=1, n_ubatch=512, kv_unified=True, swa_full=True)``: how many cells
  llama.cpp allocates: ``context_cells(n_ctx)``, ``windowed_cells(window)``.

Windowed layers (llama.cpp ``set_swa_pattern(n)``): layer ``il`` is global when
``il % n == n - 1`` (dense first: when ``il % n == 0``); ``n == 0`` makes every layer windowed.
The file's ``sliding_window_pattern`` (a per-layer array, or a scalar n) wins over the loader's
built-in n. Archs outside ``SWA_RULES`` use a window only when the file gives a per-layer array
(gemma4, step35, mimo2, granite-swa... read it); otherwise llama.cpp builds them dense.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .capacity import CapacityError, LayerKVProfile
from .kv_types import kv_type_row_bytes

LLAMA_CELL_PAD = 256  # llama.cpp pads the context and the SWA cache to this many cells


def swa_pattern(n_layer: int, n_pattern: int, dense_first: bool = False) -> tuple[bool, ...]:
    """Per-layer windowed flags exactly as llama.cpp's ``llama_hparams::set_swa_pattern``."""
    if n_layer < 0 or n_pattern < 0:
        raise CapacityError(f"swa_pattern needs n_layer >= 0 and n_pattern >= 0, got {n_layer}, {n_pattern}")
    if dense_first:
        return tuple(n_pattern == 0 or il % n_pattern != 0 for il in range(n_layer))
    return tuple(n_pattern == 0 or il % n_pattern < n_pattern - 1 for il in range(n_layer))


@dataclass(frozen=True)
class SwaRule:
    """One llama.cpp loader's sliding-window behaviour (``load_arch_hparams`` of that arch)."""

    n_pattern: int  # the built-in set_swa_pattern n (the file's pattern key wins)
    dense_first: bool = False
    needs_window_key: bool = False  # windowed only when the file has sliding_window > 0
    only_n_layer: int | None = None  # windowed only for this block count (exaone4: the 32B)
    window: int | None = None  # the window llama.cpp uses when the file has none
    fixed_window: bool = False  # llama.cpp ignores the file's window (llama4: chunks of 8192)
    chunked: bool = False  # chunked attention (llama4): same cache sizing as a window
    kv_layers: int | None = None  # only the first n layers own KV, the rest reuse it (gemma3n)


# Read from llama.cpp 0.3.36's loaders (src/models/<arch>.cpp, load_swa_pattern / set_swa_pattern);
# tests/capacity checks the ones a tiny GGUF can be written for against the real engine.
SWA_RULES: dict[str, SwaRule] = {
    "gemma2": SwaRule(2),
    "gemma3": SwaRule(6),
    "gemma3n": SwaRule(5, kv_layers=20),
    "gemma-embedding": SwaRule(6),
    "cohere2": SwaRule(4),
    "cohere2moe": SwaRule(4, dense_first=True),
    "gpt-oss": SwaRule(2),
    "exaone4": SwaRule(4, only_n_layer=64, window=4096),
    "exaone-moe": SwaRule(4),
    "olmo2": SwaRule(4, needs_window_key=True),
    "smallthinker": SwaRule(4, dense_first=True, needs_window_key=True),
    "laguna": SwaRule(4, dense_first=True),
    "afmoe": SwaRule(4),
    "mellum": SwaRule(4),
    "plamo3": SwaRule(8),
    "llama4": SwaRule(4, window=8192, fixed_window=True, chunked=True),
}
# No KV cache at all: recurrent state only (a fixed size per sequence, not priced here).
RECURRENT_ARCHS = frozenset({"mamba", "mamba2", "rwkv6", "rwkv6qwen2", "rwkv7", "arwkv7"})
# Multi-head latent attention: one compressed row per token (kv_lora_rank + rope dims), K only.
MLA_ARCHS = frozenset({"deepseek2", "deepseek2-ocr", "glm-dsa", "kimi-linear", "mistral4"})


@dataclass(frozen=True)
class LayerKV:
    k_width: int
    v_width: int
    windowed: bool = False
    kv_heads: int = 1  # the rows split into this many heads (a quantized type needs whole blocks per head)

    def __post_init__(self) -> None:
        if self.k_width < 0 or self.v_width < 0 or self.k_width + self.v_width == 0:
            raise CapacityError(f"LayerKV widths must be >= 0 and not both 0, got {self.k_width}, {self.v_width}")
        if self.kv_heads < 1 or self.k_width % self.kv_heads or self.v_width % self.kv_heads:
            raise CapacityError(
                f"LayerKV widths {self.k_width}, {self.v_width} do not split into {self.kv_heads} heads"
            )

    def bytes_per_token(self, type_k: str, type_v: str) -> float:
        return kv_type_row_bytes(type_k, self.k_width) + kv_type_row_bytes(type_v, self.v_width)


@dataclass(frozen=True)
class CacheCells:
    """How llama.cpp sizes its KV caches for a context (llama-context.cpp, llama-kv-cache-iswa.cpp).

    The context is padded to 256 cells; without a unified cache each of the ``n_seq_max`` streams
    gets ``n_ctx / n_seq_max`` cells, padded. The SWA cache keeps the window of every sequence plus
    one micro-batch, padded to 256 and never more than the context; ``swa_full`` (llama.cpp's
    default) makes it as large as the context."""

    n_seq_max: int = 1
    n_ubatch: int = 512
    kv_unified: bool = True
    swa_full: bool = True
    pad: int = LLAMA_CELL_PAD

    def __post_init__(self) -> None:
        for name in ("n_seq_max", "n_ubatch", "pad"):
            if getattr(self, name) < 1:
                raise CapacityError(f"CacheCells.{name} must be >= 1, got {getattr(self, name)}")

    def _pad(self, n: int) -> int:
        return -(-n // self.pad) * self.pad

    def context_cells(self, n_ctx: int) -> int:
        """Cells of the context (non-SWA) cache llama.cpp allocates for ``n_ctx``, all streams."""
        if n_ctx < 1:
            raise CapacityError(f"n_ctx must be >= 1, got {n_ctx}")
        cells = self._pad(n_ctx)
        if self.kv_unified:
            return cells
        return self.n_seq_max * self._pad(cells // self.n_seq_max)

    def windowed_cells(self, window: int) -> int | None:
        """Cells of the SWA cache (before the cap at the context), None when it is full-size."""
        if self.swa_full:
            return None
        if self.kv_unified:
            return self._pad(window * self.n_seq_max + self.n_ubatch)
        return self.n_seq_max * self._pad(window + self.n_ubatch)


@dataclass(frozen=True)
class ModelKVLayout:
    """Which layers own KV, how wide their K and V rows are, and which keep only a window."""

    arch: str
    n_layer: int
    layers: tuple[LayerKV, ...]
    window: int = 0
    chunked: bool = False
    shared_layers: int = 0
    recurrent_layers: int = 0
    source: str = "dense"

    def __post_init__(self) -> None:
        if not self.layers:
            raise CapacityError(f"{self.arch}: no layer owns a KV cache (recurrent state only)")
        if self.window < 0:
            raise CapacityError(f"window must be >= 0, got {self.window}")
        if any(layer.windowed for layer in self.layers) and self.window == 0:
            raise CapacityError(f"{self.arch}: windowed layers need a window > 0")

    @classmethod
    def uniform(
        cls, global_layers: int, windowed_layers: int, window: int, n_kv_heads: int, head_dim_k: int,
        head_dim_v: int, arch: str = "synthetic",
    ) -> ModelKVLayout:
        """Every layer alike: ``n_kv_heads`` heads of ``head_dim_k`` / ``head_dim_v``."""
        for name, value in (("n_kv_heads", n_kv_heads), ("head_dim_k", head_dim_k), ("head_dim_v", head_dim_v)):
            if value <= 0:
                raise CapacityError(f"{name} must be > 0, got {value}")
        if global_layers < 0 or windowed_layers < 0:
            raise CapacityError(f"layer counts must be >= 0, got {global_layers}, {windowed_layers}")
        windowed = windowed_layers if window > 0 else 0
        dense = global_layers + windowed_layers - windowed
        layers = tuple(
            LayerKV(n_kv_heads * head_dim_k, n_kv_heads * head_dim_v, i >= dense, n_kv_heads)
            for i in range(global_layers + windowed_layers)
        )
        return cls(arch, len(layers), layers, window if windowed else 0,
                   source="synthetic" if windowed else "dense")

    @property
    def global_layers(self) -> int:
        return sum(1 for layer in self.layers if not layer.windowed)

    @property
    def windowed_layers(self) -> int:
        return sum(1 for layer in self.layers if layer.windowed)

    @property
    def head_dims(self) -> tuple[int, int]:
        """(K, V) head sizes a quantized type must divide: the gcd over every layer's heads (V
        falls back to K where no layer stores V)."""
        k = math.gcd(*(layer.k_width // layer.kv_heads for layer in self.layers))
        v = math.gcd(*(layer.v_width // layer.kv_heads for layer in self.layers)) or k
        return k, v

    def profile(self, type_k: str = "f16", type_v: str = "f16", cells: CacheCells | None = None) -> LayerKVProfile:
        """Price the layout. ``cells=None`` bills windowed layers for ``min(ctx, window)`` tokens
        (what a session really keeps); a ``CacheCells`` bills them as llama.cpp allocates them."""
        glob = [layer.bytes_per_token(type_k, type_v) for layer in self.layers if not layer.windowed]
        wind = [layer.bytes_per_token(type_k, type_v) for layer in self.layers if layer.windowed]
        window = self.window if wind else 0
        cap: int | None = None
        if wind and cells is not None:
            cap = cells.windowed_cells(window)
            if cap is None:  # full-size SWA cache: windowed layers cost what global ones do
                window = 0
        per_global = sum(glob) / len(glob) if glob else sum(wind) / len(wind)
        per_windowed = sum(wind) / len(wind) if wind else None
        return LayerKVProfile(
            len(glob), len(wind), window, per_global,
            windowed_layer_kv_bytes=None if per_windowed == per_global or not glob else per_windowed,
            windowed_cells=None if window == 0 or cap is None or cap == window else cap,
        )


def _scalar(value: Any, what: str) -> int:
    if isinstance(value, list):
        raise CapacityError(f"{what} must be a number, got a list")
    return int(value)


def _per_layer(value: Any, n_layer: int, what: str) -> list[int]:
    if isinstance(value, list):
        if len(value) < n_layer:
            raise CapacityError(f"{what} has {len(value)} entries, block_count is {n_layer}")
        return [int(v) for v in value[:n_layer]]
    return [int(value)] * n_layer


def _windowed_flags(
    arch: str, meta: Mapping[str, Any], n_layer: int
) -> tuple[tuple[bool, ...], int, bool, str]:
    """(windowed flags, window, chunked, source) as llama.cpp's loader for ``arch`` sets them."""
    key_window = meta.get(f"{arch}.attention.sliding_window")
    window = int(key_window or 0)
    pattern = meta.get(f"{arch}.attention.sliding_window_pattern")
    rule = SWA_RULES.get(arch)
    dense = (tuple([False] * n_layer), 0, False, "dense")
    if rule is None:
        if isinstance(pattern, list) and window > 0:
            flags = _pattern_array(pattern, n_layer)
            return flags, window, False, "pattern array"
        return dense
    if rule.needs_window_key and window <= 0:
        return dense
    if rule.only_n_layer is not None and n_layer != rule.only_n_layer:
        return dense
    if rule.fixed_window:
        if key_window is not None and window == 0:
            return dense  # llama4: an explicit 0 turns chunking off
        window = int(rule.window or 0)
    elif window <= 0:
        window = int(rule.window or 0)
    if window <= 0:
        return dense  # no window to keep (llama.cpp itself refuses most such files)
    if isinstance(pattern, list):
        return _pattern_array(pattern, n_layer), window, rule.chunked, "pattern array"
    if pattern is not None:
        n = _scalar(pattern, f"{arch}.attention.sliding_window_pattern")
        return swa_pattern(n_layer, n, rule.dense_first), window, rule.chunked, f"pattern stride {n}"
    order = ", dense first" if rule.dense_first else ""
    flags = swa_pattern(n_layer, rule.n_pattern, rule.dense_first)
    return flags, window, rule.chunked, f"{arch} built-in stride {rule.n_pattern}{order}"


def _pattern_array(pattern: Sequence[Any], n_layer: int) -> tuple[bool, ...]:
    if len(pattern) != n_layer:
        raise CapacityError(f"sliding_window_pattern has {len(pattern)} entries, block_count is {n_layer}")
    return tuple(bool(p) for p in pattern)


def layout_from_metadata(meta: Mapping[str, Any]) -> ModelKVLayout:
    """The KV layout llama.cpp builds for a GGUF with this metadata (see the module docstring)."""
    arch = meta.get("general.architecture")
    if not isinstance(arch, str):
        raise CapacityError("metadata lacks general.architecture")

    def get(key: str, default: Any = None) -> Any:
        value = meta.get(f"{arch}.{key}", default)
        if value is None:
            raise CapacityError(f"metadata lacks {arch}.{key}")
        return value

    n_layer = _scalar(get("block_count"), f"{arch}.block_count")
    if arch in RECURRENT_ARCHS:
        raise CapacityError(f"{arch} is a recurrent model: it keeps no KV cache to size")
    n_embd = _scalar(get("embedding_length"), f"{arch}.embedding_length")
    heads = _per_layer(get("attention.head_count"), n_layer, f"{arch}.attention.head_count")
    first_heads = next((h for h in heads if h > 0), 0)
    kv_heads = _per_layer(get("attention.head_count_kv", heads), n_layer, f"{arch}.attention.head_count_kv")
    fallback = n_embd // first_heads if first_heads else 0
    head_k = int(meta.get(f"{arch}.attention.key_length") or fallback)
    head_v = int(meta.get(f"{arch}.attention.value_length") or fallback)
    head_k_swa = int(meta.get(f"{arch}.attention.key_length_swa") or head_k)
    head_v_swa = int(meta.get(f"{arch}.attention.value_length_swa") or head_v)
    flags, window, chunked, source = _windowed_flags(arch, meta, n_layer)

    recurrent = [h == 0 for h in kv_heads]  # hybrid models: a layer without KV heads is recurrent
    interval = meta.get(f"{arch}.full_attention_interval")
    if interval:
        step = int(interval)
        recurrent = [(il + 1) % step != 0 for il in range(n_layer)]
    owned = n_layer
    rule = SWA_RULES.get(arch)
    if rule is not None and rule.kv_layers is not None:
        owned = min(n_layer, rule.kv_layers)
    shared = meta.get(f"{arch}.attention.shared_kv_layers")
    if shared:
        owned = min(owned, n_layer - int(shared))

    lora = meta.get(f"{arch}.attention.kv_lora_rank")
    layers: list[LayerKV] = []
    for il in range(owned):
        if recurrent[il]:
            continue
        if arch in MLA_ARCHS and lora:
            rope = int(meta.get(f"{arch}.rope.dimension_count") or 0)
            layers.append(LayerKV(int(lora) + rope, 0, flags[il]))
            continue
        hk, hv = (head_k_swa, head_v_swa) if flags[il] else (head_k, head_v)
        layers.append(LayerKV(kv_heads[il] * hk, kv_heads[il] * hv, flags[il], kv_heads[il]))
    if not any(layer.windowed for layer in layers):
        window, chunked = 0, False
    return ModelKVLayout(
        arch, n_layer, tuple(layers), window, chunked,
        shared_layers=n_layer - owned,
        recurrent_layers=sum(1 for il in range(owned) if recurrent[il]),
        source=source if window else "dense",
    )


def profile_from_metadata(meta: Mapping[str, Any], type_k: str = "f16", type_v: str = "f16") -> LayerKVProfile:
    """The session-level profile (windowed layers billed for their window) of GGUF-style metadata."""
    return layout_from_metadata(meta).profile(type_k, type_v)
