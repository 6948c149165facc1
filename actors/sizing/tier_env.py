"""The T* tier choice's settings from the environment, and its audit log.

Primitives:
- ``auto_tier_enabled(env)``: KVRES_KV_AUTO_TIER (1/true/yes/on enable; unset, empty, 0/false/no/off
  disable; anything else is an ``EnvValueError``).
- ``tier_config_from_env(env) -> TierConfig``: KVRES_KV_AUTO_TIER, KVRES_KV_TSTAR_DROP (default
  0.20), KVRES_KV_TSTAR_MAX_SPILL_MIB (default 800).
- ``env_float(env, name, default, minimum=0, strict=False)``: a finite number from the environment.
- ``EnvValueError``: names the variable, its value and what was expected.
- ``log_tier_decision(decision, log=None)``: the decision with all its terms at WARNING on
  ``kvres.tiering``, so operators can audit it.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping

from kvres.policy.tiering import (
    DEFAULT_MAX_SPILL_MIB,
    DEFAULT_TARGET_DROP,
    MIB,
    TierConfig,
    TierDecision,
    TieringError,
)

ENV_AUTO_TIER = "KVRES_KV_AUTO_TIER"
ENV_TARGET_DROP = "KVRES_KV_TSTAR_DROP"
ENV_MAX_SPILL_MIB = "KVRES_KV_TSTAR_MAX_SPILL_MIB"
LOGGER_NAME = "kvres.tiering"
logger = logging.getLogger(LOGGER_NAME)


class EnvValueError(TieringError):
    """An environment variable holds a value kvres cannot use; names the variable and the value."""

    def __init__(self, name: str, value: str, expected: str) -> None:
        super().__init__(f"environment variable {name}={value!r} is invalid: expected {expected}")
        self.name = name
        self.value = value
        self.expected = expected


def log_tier_decision(decision: TierDecision, log: logging.Logger | None = None) -> None:
    (log or logger).warning("%s", decision.summary(), extra={"kvres_tier_decision": decision.as_dict()})


_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"", "0", "false", "no", "off"})


def env_float(
    env: Mapping[str, str], name: str, default: float | None, *, minimum: float = 0.0, strict: bool = False
) -> float | None:
    """A finite float from ``env[name]`` (>= minimum, or > minimum when strict); unset/empty -> default."""
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return default
    expected = f"a finite number {'>' if strict else '>='} {minimum:g}"
    try:
        value = float(raw.strip())
    except ValueError:
        raise EnvValueError(name, raw, expected) from None
    if not math.isfinite(value) or value < minimum or (strict and value == minimum):
        raise EnvValueError(name, raw, expected)
    return value


def auto_tier_enabled(env: Mapping[str, str]) -> bool:
    """KVRES_KV_AUTO_TIER: 1/true/yes/on enable; unset, empty, 0/false/no/off disable."""
    raw = env.get(ENV_AUTO_TIER)
    if raw is None or raw.strip().lower() in _FALSE:
        return False
    if raw.strip().lower() in _TRUE:
        return True
    raise EnvValueError(ENV_AUTO_TIER, raw, "1 to enable (or 0 / unset to disable)")


def tier_config_from_env(env: Mapping[str, str]) -> TierConfig:
    """KVRES_KV_AUTO_TIER (1/true/yes/on; unset/0 = off), KVRES_KV_TSTAR_DROP (default 0.20),
    KVRES_KV_TSTAR_MAX_SPILL_MIB (default 800)."""
    auto = auto_tier_enabled(env)
    drop = env_float(env, ENV_TARGET_DROP, DEFAULT_TARGET_DROP)
    cap_mib = env_float(env, ENV_MAX_SPILL_MIB, DEFAULT_MAX_SPILL_MIB)
    assert drop is not None and cap_mib is not None  # defaults are not None
    return TierConfig(auto=auto, target_drop=drop, max_spill_bytes=cap_mib * MIB)
