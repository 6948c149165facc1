"""Environment configuration of the tier choice: defaults, values, typed errors naming bad values."""

from __future__ import annotations

import pytest

from kvres.actors.sizing.tier_env import EnvValueError, auto_tier_enabled, env_float, tier_config_from_env
from kvres.policy.errors import KvresError
from kvres.policy.tiering import MIB, TierConfig


def test_defaults_when_unset() -> None:
    assert tier_config_from_env({}) == TierConfig(auto=False, target_drop=0.20, max_spill_bytes=800 * MIB)
    assert not auto_tier_enabled({})


@pytest.mark.parametrize("raw", ["1", "true", "YES", " on "])
def test_auto_tier_opt_in(raw: str) -> None:
    assert auto_tier_enabled({"KVRES_KV_AUTO_TIER": raw})


@pytest.mark.parametrize("raw", ["", "0", "false", "off", "No"])
def test_auto_tier_off(raw: str) -> None:
    assert not auto_tier_enabled({"KVRES_KV_AUTO_TIER": raw})


def test_values_are_read() -> None:
    cfg = tier_config_from_env(
        {"KVRES_KV_AUTO_TIER": "1", "KVRES_KV_TSTAR_DROP": "0.3", "KVRES_KV_TSTAR_MAX_SPILL_MIB": "64"}
    )
    assert cfg == TierConfig(auto=True, target_drop=0.3, max_spill_bytes=64 * MIB)


@pytest.mark.parametrize(
    ("name", "raw"),
    [
        ("KVRES_KV_AUTO_TIER", "maybe"),
        ("KVRES_KV_TSTAR_DROP", "fast"),
        ("KVRES_KV_TSTAR_DROP", "-0.1"),
        ("KVRES_KV_TSTAR_DROP", "nan"),
        ("KVRES_KV_TSTAR_MAX_SPILL_MIB", "inf"),
        ("KVRES_KV_TSTAR_MAX_SPILL_MIB", "800MiB"),
    ],
)
def test_bad_values_name_the_variable_and_value(name: str, raw: str) -> None:
    with pytest.raises(EnvValueError) as info:
        tier_config_from_env({"KVRES_KV_AUTO_TIER": "1", name: raw})
    assert info.value.name == name and info.value.value == raw
    assert name in str(info.value) and repr(raw) in str(info.value)
    assert isinstance(info.value, KvresError) and isinstance(info.value, ValueError)


def test_env_float_strict_minimum() -> None:
    assert env_float({"X": "2.5"}, "X", None, strict=True) == 2.5
    assert env_float({}, "X", 7.0) == 7.0
    with pytest.raises(EnvValueError, match="X='0'"):
        env_float({"X": "0"}, "X", None, strict=True)
