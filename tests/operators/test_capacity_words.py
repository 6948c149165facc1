"""``kvres capacity`` in plain words: T* as a sentence, the trained context as a cap with a warning."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvres.cluster.capacity_report import parse_bytes
from kvres.cluster.cli import main
from kvres.policy.capacity import CapacityError

CHAT = Path(__file__).resolve().parents[2] / "models" / "chat.gguf"  # trained on 512 positions


@pytest.fixture(autouse=True)
def pinned_probes(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name, value in {"KVRES_CACHE_DIR": str(tmp_path), "KVRES_HOST_RAM_GBPS": "10", "KVRES_VRAM_GBPS": "100",
                        "KVRES_PCIE_GBPS": "5", "KVRES_C_ENGAGE_MS": "0.5"}.items():
        monkeypatch.setenv(name, value)


def test_a_model_trained_on_512_positions_is_capped_there_with_a_warning(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["capacity", str(CHAT), "--memory", "8GiB"]) == 0
    out = capsys.readouterr().out
    assert "trained context 512" in out
    rows = {c[0]: c for c in (line.split() for line in out.splitlines()) if c and c[0] == "f16/f16"}
    assert rows["f16/f16"][-1] == "512"  # usable
    warning = next(line for line in out.splitlines() if line.startswith("warning"))
    assert "trained on 512 positions (llama.context_length)" in warning and "at most 512" in warning
    # T* in words: c_engage 0.5 ms is more than 20% of a token's time on this tiny model: never spill
    assert "T*         how much KV may spill to host memory: none: engaging the spill path alone (0.500 ms)" in out
    assert "spilling is never worth it here" in out
    assert "T* -" not in out and "-12." not in out  # no raw negative T*


def test_the_json_carries_the_cap_and_the_warnings(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["capacity", str(CHAT), "--memory", "8GiB", "--context", "4096", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["layout"]["trained_context"] == 512
    assert all(t["usable_context"] == 512 for t in report["tiers"] if t["supported"])
    assert any(t["fits_llama_cpp"] > 512 for t in report["tiers"])  # what the memory holds, uncapped
    assert any("--context 4096 is past the 512 positions" in w for w in report["warnings"])


def test_a_spill_is_said_in_words(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KVRES_C_ENGAGE_MS", "0")
    assert main(["capacity", str(CHAT), "--memory", "300KiB", "--context", "512"]) == 0
    out = capsys.readouterr().out
    tier = next(line for line in out.splitlines() if line.startswith("KV tier"))
    assert "for 512 tokens in 0.3 MiB" in tier
    assert "needs 0.5 MiB: a smaller tier is taken" in tier or "spills to host memory" in tier
    assert next(line for line in out.splitlines() if line.startswith("T*")).startswith(
        "T*         how much KV may spill to host memory: up to")


def test_parse_bytes_reads_sizes_as_pydantic_does() -> None:
    assert parse_bytes("1.5GiB") == 3 << 29 and parse_bytes("2 gb") == 2 * 10**9 and parse_bytes("1e9") == 10**9
    with pytest.raises(CapacityError, match="'lots' is not a size"):
        parse_bytes("lots")
