"""``kvres capacity MODEL.gguf [--memory 8GiB] [--json]``: the table and the JSON."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvres.cluster.capacity_report import parse_bytes
from kvres.cluster.cli import main
from kvres.policy.capacity import CapacityError

from .arch_models import ARCH_MODELS, write_arch_model


@pytest.fixture(scope="module")
def gemma3(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_arch_model(ARCH_MODELS["gemma3"], tmp_path_factory.mktemp("cli") / "gemma3.gguf")


@pytest.fixture(autouse=True)
def pinned_probes(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name, value in {"KVRES_CACHE_DIR": str(tmp_path), "KVRES_HOST_RAM_GBPS": "10", "KVRES_VRAM_GBPS": "100",
                        "KVRES_PCIE_GBPS": "5", "KVRES_C_ENGAGE_MS": "0.5"}.items():
        monkeypatch.setenv(name, value)


def test_json(gemma3: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["capacity", str(gemma3), "--memory", "64MiB", "--context", "8192", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    lay = report["layout"]
    assert (lay["global_layers"], lay["windowed_layers"], lay["window"]) == (1, 7, 128)
    assert lay["pattern"] == "gemma3 built-in stride 6"
    assert report["memory_bytes"] == 64 << 20 and report["context"] == 8192
    f16, q8, q4 = report["tiers"]
    per_layer = 2 * 2 * 32 * 2  # K + V, 2 KV heads of 32, f16
    assert f16["bytes_per_token_growth"] == per_layer  # only the global layer grows past the window
    assert f16["kv_bytes_at_context"] == 8192 * per_layer + 7 * 128 * per_layer
    assert f16["fits_dense"] == (64 << 20) // (8 * per_layer)
    assert f16["fits_windowed"] == (64 << 20) // per_layer - 7 * 128  # the window floor, then 1 layer
    assert f16["fits_llama_cpp_full_swa"] == f16["fits_dense"] // 256 * 256
    assert f16["fits_dense"] < f16["fits_llama_cpp"] <= f16["fits_windowed"]
    assert q8["fits_windowed"] > f16["fits_windowed"] and q4["fits_windowed"] > q8["fits_windowed"]
    assert f16["swa_saving"] == pytest.approx(1 - (8192 + 7 * 128) / (8 * 8192))
    tstar = report["tstar"]
    assert tstar["chosen"] == "f16/f16" and tstar["budget_bytes"] == 64 << 20
    assert (tstar["vram_gbps"], tstar["pcie_gbps"], tstar["c_engage_s"]) == (100.0, 5.0, 0.5e-3)
    assert report["probe_sources"]["vram_gbps"] == "env"


def test_table(gemma3: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["capacity", str(gemma3), "--memory", "64MiB", "--context", "8192"]) == 0
    out = capsys.readouterr().out
    assert "gemma3: 8 blocks, 8 with KV (1 global, 7 windowed of 128 tokens" in out
    assert "pattern: gemma3 built-in stride 6" in out
    header = next(line for line in out.splitlines() if line.startswith("tier"))
    for column in ("B/token", "KV @ ctx", "dense @ ctx", "SWA saves", "fits (T0)", "fits dense", "llama.cpp"):
        assert column in header
    tiers = ("f16/f16", "q8_0/q8_0", "q4_0/q4_0")
    rows = {cells[0]: cells for cells in (line.split() for line in out.splitlines()) if cells and cells[0] in tiers}
    assert set(rows) == set(tiers)
    assert rows["f16/f16"][1] == "256" and rows["f16/f16"][-5] == "261,248"  # bytes/token growth, fits (T0)
    assert rows["f16/f16"][-1] == "16,384"  # usable: capped at the trained context
    assert "KV tier    f16/f16 for 8,192 tokens in 64.0 MiB: the whole KV cache" in out
    assert "warning    the model was trained on 16,384 positions" in out
    assert "bw_eff 5.00 GB/s (pcie" in out


def test_bad_input_is_one_line_naming_the_value(gemma3: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["capacity", str(gemma3), "--memory", "lots"]) == 1
    assert "memory 'lots' is not a size" in capsys.readouterr().err
    assert main(["capacity", str(gemma3.parent / "missing.gguf"), "--memory", "1GiB"]) == 1
    assert "missing.gguf" in capsys.readouterr().err


def test_parse_bytes() -> None:
    assert parse_bytes("8GiB") == 8 << 30 and parse_bytes("512 MiB") == 512 << 20
    assert parse_bytes("2GB") == 2_000_000_000 and parse_bytes("1e9") == 10**9 and parse_bytes("4096") == 4096
    with pytest.raises(CapacityError, match="'8 parsecs'"):
        parse_bytes("8 parsecs")
    with pytest.raises(CapacityError, match="at least 1 byte"):
        parse_bytes("0.1")


def test_the_device_is_named_and_a_machine_without_a_gpu_says_so(gemma3: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    from kvres.actors.sizing.device_memory import llama_gpu_memory

    assert main(["capacity", str(gemma3), "--memory", "64MiB", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert main(["capacity", str(gemma3), "--memory", "64MiB"]) == 0
    out = capsys.readouterr().out
    gpu = llama_gpu_memory(0)
    if gpu is None:
        assert report["gpu"] is None
        assert "device     no GPU" in out and "vram" not in out, out
        assert "/ host RAM (no GPU) 100.0 GB/s" in out  # the decode's bandwidth is host RAM's
    else:
        assert report["gpu"] == f"{gpu.name} ({gpu.description})" and f"device     {report['gpu']}" in out
        assert "/ vram 100.0 GB/s" in out
