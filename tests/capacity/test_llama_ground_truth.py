"""kvres's KV layout and bytes against llama.cpp's own allocation, across architectures and KV types.

Each tiny GGUF (tests/capacity/arch_models.py) is loaded by the real llama.cpp; its log says which
blocks are windowed and how large each KV cache is. kvres predicts the same from the metadata alone
(``kvres.policy.kv_layout``): the windowed flags exactly, the cells and layers of every cache
exactly, and the bytes within 1% (llama.cpp's MiB figures carry two decimals).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kvres.actors.model_files import layout_from_gguf, read_gguf_metadata
from kvres.policy.kv_layout import CacheCells, ModelKVLayout

from .arch_models import ARCH_MODELS, write_arch_model
from .llama_report import KVReport, llama_kv_report

TYPES = [("f16", "f16"), ("q8_0", "q8_0")]


@pytest.fixture(scope="module")
def arch_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("archs")
    return {name: write_arch_model(spec, folder / f"{name}.gguf") for name, spec in ARCH_MODELS.items()}


def _check(layout: ModelKVLayout, report: KVReport, cells: CacheCells, type_k: str, type_v: str) -> None:
    owned = report.windowed[: layout.n_layer - layout.shared_layers]  # the rest reuse their KV
    assert owned == tuple(layer.windowed for layer in layout.layers)
    windowed_cap = cells.windowed_cells(layout.window)
    expected_cells = {False: report.n_ctx, True: min(report.n_ctx, windowed_cap or report.n_ctx)}
    per_cache = {False: layout.global_layers, True: layout.windowed_layers}
    caches = [c for c in report.caches if c.layers]
    kinds = [False, True] if layout.windowed_layers else [False]
    if layout.windowed_layers and not layout.global_layers:
        kinds = [True]
    assert len(caches) == len(kinds)
    for cache, windowed in zip(caches, kinds, strict=True):
        assert cache.cells * cache.streams == expected_cells[windowed]
        assert cache.layers == per_cache[windowed]
        assert (cache.type_k, cache.type_v) == (type_k, type_v)
    predicted = layout.profile(type_k, type_v, cells).kv_bytes_for_context(report.n_ctx)
    assert predicted == pytest.approx(report.buffer_bytes, rel=0.01)


@pytest.mark.parametrize(("type_k", "type_v"), TYPES)
@pytest.mark.parametrize("name", list(ARCH_MODELS))
def test_predicted_kv_bytes_match_llama_cpp(
    name: str, type_k: str, type_v: str, arch_files: dict[str, Path]
) -> None:
    """Windowed caches as kvres would run them small (swa_full off), two sequences sharing one cache."""
    path = arch_files[name]
    layout = layout_from_gguf(path)
    cells = CacheCells(n_seq_max=2, n_ubatch=256, kv_unified=True, swa_full=False)
    report = llama_kv_report(path, n_ctx=3000, n_seq_max=2, n_batch=256, type_k=type_k, type_v=type_v,
                             flash_attn=type_v != "f16" or None, swa_full=False)
    assert report.n_ctx == cells.context_cells(3000) == 3072  # llama.cpp pads the context to 256 cells
    _check(layout, report, cells, type_k, type_v)


@pytest.mark.parametrize("name", ["gemma2", "gemma3", "gpt-oss", "llama"])
def test_full_size_and_per_stream_caches(name: str, arch_files: dict[str, Path]) -> None:
    """llama.cpp's defaults (full-size SWA cache) and one cache stream per sequence."""
    path = arch_files[name]
    layout = layout_from_gguf(path)
    full = CacheCells(n_seq_max=1, swa_full=True)
    _check(layout, llama_kv_report(path, n_ctx=4096), full, "f16", "f16")
    streams = CacheCells(n_seq_max=3, n_ubatch=128, kv_unified=False, swa_full=False)
    report = llama_kv_report(path, n_ctx=4096, n_seq_max=3, n_batch=128, kv_unified=False, swa_full=False)
    assert report.n_ctx == streams.context_cells(4096) == 3 * 1536
    _check(layout, report, streams, "f16", "f16")


def test_gemma3_without_a_pattern_key_uses_llama_cpps_stride(arch_files: dict[str, Path]) -> None:
    meta = read_gguf_metadata(arch_files["gemma3"])
    assert "gemma3.attention.sliding_window_pattern" not in meta
    layout = layout_from_gguf(arch_files["gemma3"])
    assert (layout.global_layers, layout.windowed_layers) == (1, 7)  # block 5 of 0..7 is global
    assert layout.source == "gemma3 built-in stride 6"
    stride = layout_from_gguf(arch_files["gemma3-stride4"])  # 10 blocks, n = 4: blocks 3 and 7
    assert stride.global_layers == 2 and stride.source == "pattern stride 4"
