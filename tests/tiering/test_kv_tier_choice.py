"""choose_kv_types: the integration point the llama backend calls when it creates a context."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from kvres.actors.model_files import tensor_bytes
from kvres.actors.sizing import kv_tier_choice
from kvres.actors.sizing.kv_tier_choice import KVTypeChoice, choose_kv_types
from kvres.actors.sizing.probes import ProbeResults
from kvres.actors.sizing.tier_env import EnvValueError
from kvres.policy.tiering import MIB

from .refs import QWEN14B, QWEN_CTX

REF_PROBES = ProbeResults(device="ref-3090", host_ram_gbps=11.5, pcie_gbps=6.7, vram_gbps=936.0, c_engage_ms=0.8)
PREVIOUS_DEFAULT = ("f16", "f16", 2048, None)


def _no_probing(monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(*a: object, **k: object) -> None:
        raise AssertionError("probed although auto tier is off")

    monkeypatch.setattr(kv_tier_choice, "load_probes", boom)
    monkeypatch.setattr(kv_tier_choice, "read_gguf_metadata", boom)


@pytest.mark.parametrize("env", [{}, {"KVRES_KV_AUTO_TIER": "0"}, {"KVRES_KV_AUTO_TIER": ""}])
def test_off_returns_exactly_the_previous_default(
    env: dict[str, str], stories_model: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    _no_probing(monkeypatch)
    bad_rest = {**env, "KVRES_KV_TSTAR_DROP": "bogus", "KVRES_HOST_RAM_GBPS": "bogus"}  # not even read
    with caplog.at_level(logging.DEBUG, logger="kvres.tiering"):
        got = choose_kv_types(stories_model, 2048, 1.0, env=bad_rest)
        assert got == PREVIOUS_DEFAULT and tuple(got) == PREVIOUS_DEFAULT
        assert choose_kv_types(None, 2048, 0.0, "q8_0", "q4_0", env=env) == ("q8_0", "q4_0", 2048, None)
        assert choose_kv_types(None, 2048, 0.0, "q8_0", env=env) == ("q8_0", "f16", 2048, None)
    assert not caplog.records


def test_bad_opt_in_value_is_named() -> None:
    with pytest.raises(EnvValueError, match="KVRES_KV_AUTO_TIER='please'"):
        choose_kv_types(None, 2048, 0.0, env={"KVRES_KV_AUTO_TIER": "please"})


def test_explicit_v_disables_auto(monkeypatch: pytest.MonkeyPatch) -> None:
    _no_probing(monkeypatch)
    env = {"KVRES_KV_AUTO_TIER": "1"}
    assert choose_kv_types(None, 4096, 0.0, None, "q8_0", env=env) == ("f16", "q8_0", 4096, None)
    assert choose_kv_types(None, 4096, 0.0, "q4_0", "f16", env=env) == ("q4_0", "f16", 4096, None)


def test_on_reference_host_chooses_q8_and_logs(caplog: pytest.LogCaptureFixture) -> None:
    f16 = QWEN14B.profile("f16", "f16").kv_bytes_for_context(QWEN_CTX)
    with caplog.at_level(logging.WARNING, logger="kvres.tiering"):
        got = choose_kv_types(
            None, QWEN_CTX, f16 - 1630 * MIB, env={"KVRES_KV_AUTO_TIER": "1"},
            profile_for=QWEN14B.profile, head_dims=(128, 128), weights_active_bytes=15.7e9, probes=REF_PROBES,
        )
    assert isinstance(got, KVTypeChoice)
    assert (got.type_k, got.type_v, got.resident_budget_tokens) == ("q8_0", "q8_0", QWEN_CTX)
    assert got.decision is not None and got.decision.binding_link == "pcie"
    assert any(r.levelno == logging.WARNING and "KV tier q8_0/q8_0" in r.getMessage() for r in caplog.records)
    # a quantized K cannot shift positions: the decision and its log record say so
    assert not got.decision.position_shift
    [record] = [r for r in caplog.records if "KV tier" in r.getMessage()]
    assert "position_shift=false" in record.getMessage()
    assert record.kvres_tier_decision["position_shift"] is False  # type: ignore[attr-defined]


def test_on_explicit_k_walks_v(caplog: pytest.LogCaptureFixture) -> None:
    f16 = QWEN14B.profile("f16", "f16").kv_bytes_for_context(QWEN_CTX)
    got = choose_kv_types(
        None, QWEN_CTX, 0.8 * f16, "f16", env={"KVRES_KV_AUTO_TIER": "1", "KVRES_KV_TSTAR_DROP": "0.05"},
        profile_for=QWEN14B.profile, head_dims=(128, 128), weights_active_bytes=15.7e9, probes=REF_PROBES,
    )
    assert got[:2] == ("f16", "q8_0") and got.decision is not None
    assert got.decision.target_drop == 0.05 and got.decision.explicit_type_k == "f16"
    assert got.decision.position_shift  # only V is quantized: K still shifts


def test_on_stories260k_from_the_gguf(stories_model: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The real model: layout from GGUF metadata, probes from the (env-pinned) cache dir.

    stories260K's head_dim is 8, so no quantized tier can be built: f16 stays, and a budget that
    is too small spills its tail (the floor fallback) instead of failing to create a context."""
    env = {
        "KVRES_KV_AUTO_TIER": "1", "KVRES_CACHE_DIR": str(tmp_path), "KVRES_HOST_RAM_GBPS": "11.5",
        "KVRES_VRAM_GBPS": "11.5", "KVRES_C_ENGAGE_MS": "0.1",
    }
    with caplog.at_level(logging.WARNING, logger="kvres.tiering"):
        got = choose_kv_types(stories_model, 2048, 1024 * 640, env=env)
    assert got[:3] == ("f16", "f16", 1024)
    d = got.decision
    assert d is not None and d.floor_fallback and d.kv_bytes[0] == 2048 * 640
    assert [t.name for t in d.unsupported] == ["q8_0/q8_0", "q4_0/q4_0"]
    tensors = tensor_bytes(stories_model)  # W_active: what a decode step reads, not the file size
    tied = "output.weight" not in tensors
    assert d.weights_active_bytes == sum(tensors.values()) - (0 if tied else tensors["token_embd.weight"])
    assert d.weights_active_bytes < stories_model.stat().st_size
    assert d.binding_link in ("none", "pcie", "host_ram")
    assert "KV tier f16/f16" in caplog.text
    got = choose_kv_types(stories_model, 2048, 4096 * 640, env=env)
    assert got[:3] == ("f16", "f16", 2048) and got.decision is not None and not got.decision.spills


def test_missing_model_is_a_typed_error(tmp_path: Path) -> None:
    from kvres.policy.errors import ModelLoadError

    with pytest.raises(ModelLoadError, match="nope.gguf"):
        choose_kv_types(tmp_path / "nope.gguf", 512, 1.0, env={"KVRES_KV_AUTO_TIER": "1"})

