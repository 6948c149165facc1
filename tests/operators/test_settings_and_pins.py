"""Settings from the environment (pydantic-settings) and the pinned engine version."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from kvres.actors.metrics import MetricsConfigError, per_session_opted_in, session_ids_opted_in
from kvres.actors.pins import (
    LLAMA_CPP_PYTHON,
    RAY_FLOOR,
    EngineVersionError,
    check_llama_cpp_python,
    installed_version,
)
from kvres.actors.settings import SettingsError, read_settings

REPO = Path(__file__).resolve().parents[2]


def test_settings_read_every_field_from_kvres_variables(tmp_path: Path) -> None:
    s = read_settings({"KVRES_CACHE_DIR": str(tmp_path), "KVRES_CONFIG": "{}", "KVRES_METRICS_PER_SESSION": "yes",
                       "OTHER": "x"})
    assert (s.cache_dir, s.config, s.metrics_per_session, s.metrics_session_ids) == (tmp_path, "{}", True, False)
    assert read_settings({}).per_session_series is False
    assert read_settings({"KVRES_METRICS_SESSION_IDS": "1"}).per_session_series is True  # ids imply series
    assert read_settings({"KVRES_METRICS_PER_SESSION": ""}).metrics_per_session is False  # empty: unset


def test_settings_read_the_process_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("KVRES_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("KVRES_METRICS_PER_SESSION", "on")
    s = read_settings()
    assert s.cache_dir == tmp_path and s.metrics_per_session is True
    assert per_session_opted_in() is True


def test_a_bad_value_names_the_variable_and_the_value() -> None:
    with pytest.raises(SettingsError, match="KVRES_METRICS_PER_SESSION='maybe'"):
        read_settings({"KVRES_METRICS_PER_SESSION": "maybe"})
    with pytest.raises(MetricsConfigError, match="KVRES_METRICS_SESSION_IDS='perhaps'"):
        session_ids_opted_in({"KVRES_METRICS_SESSION_IDS": "perhaps"})
    assert per_session_opted_in({"KVRES_METRICS_PER_SESSION": "0"}) is False


def test_llama_cpp_python_is_the_pinned_version() -> None:
    assert installed_version("llama-cpp-python") == LLAMA_CPP_PYTHON
    check_llama_cpp_python()  # the installed one passes


def test_another_llama_cpp_python_is_refused_naming_both_versions(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(EngineVersionError) as caught:
        check_llama_cpp_python("0.3.37")
    assert "0.3.37" in str(caught.value) and LLAMA_CPP_PYTHON in str(caught.value)
    assert "state_blob" in str(caught.value)
    from kvres.actors import pins

    monkeypatch.setattr(pins, "installed_version", lambda name: None)
    with pytest.raises(EngineVersionError, match=f"not installed.*llama-cpp-python=={LLAMA_CPP_PYTHON}"):
        check_llama_cpp_python()


def test_pyproject_pins_what_the_code_is_tested_with() -> None:
    text = (REPO / "pyproject.toml").read_text()
    major_minor = ".".join(RAY_FLOOR.split(".")[:2])
    assert f'llama = ["llama-cpp-python=={LLAMA_CPP_PYTHON}"]' in text
    assert f'"ray[default]>={major_minor},<3"' in text and f'"ray[serve]>={major_minor},<3"' in text
    assert re.search(r'^    "pydantic-settings>=[0-9.]+,<3",$', text, re.M)
    import ray

    assert tuple(int(p) for p in ray.__version__.split(".")[:2]) >= tuple(int(p) for p in RAY_FLOOR.split(".")[:2])


def test_every_backend_field_is_an_environment_override() -> None:
    from kvres.actors.config import BackendConfig
    from kvres.actors.settings import backend_overrides

    env = {"KVRES_MODEL": "m.gguf", "KVRES_N_CTX": "512", "KVRES_KV_BUDGET_TOKENS": "256", "KVRES_NAME": "x",
           "KVRES_OPENVINO_DEVICE": "GPU", "KVRES_N_SEQ_MAX": ""}
    patch = backend_overrides(env)
    assert patch == {"model_path": "m.gguf", "n_ctx": "512", "kv_budget_tokens": "256", "openvino_device": "GPU"}
    config = BackendConfig.model_validate({**patch, "model_path": None})
    assert (config.n_ctx, config.kv_budget_tokens, config.openvino_device) == (512, 256, "GPU")
    assert backend_overrides({"kvres_kv_memory_bytes": "8GiB"}) == {"kv_memory_bytes": 8 << 30}
    for field in BackendConfig.model_fields:  # each field but the per-backend ones has its variable
        if field not in ("name", "node_id", "model_path"):
            value = "1GiB" if field.endswith("_bytes") else "v"
            assert field in backend_overrides({f"KVRES_{field.upper()}": value}), field
    with pytest.raises(SettingsError, match="KVRES_KV_MEMORY_BYTES='lots'"):
        backend_overrides({"KVRES_KV_MEMORY_BYTES": "lots"})
