"""Validated configuration (pydantic): the whole cluster's.

Primitives:
- ``SessionPolicy``, ``BackendConfig``: re-exported from ``kvres.actors.config``.
- ``ColdStoreConfig``: RAM and disk byte budgets, disk folder.
- ``KvresConfig``: the whole thing; ``KvresConfig.from_env(env)`` applies ``KVRES_*`` overrides.

Every bad value is a ``pydantic.ValidationError`` (a ValueError) whose message names the field.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, model_validator

from kvres.actors.config import BackendConfig, SessionPolicy

MiB = 1024 * 1024


class ColdStoreConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    ram_budget_bytes: int = Field(256 * MiB, ge=0)
    disk_budget_bytes: int = Field(1024 * MiB, ge=0)
    disk_dir: Path | None = None  # None: a per-node folder under the system temp dir


class KvresConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    backends: list[BackendConfig] = Field(default_factory=lambda: [BackendConfig()], min_length=1)
    cold_store: ColdStoreConfig = Field(default_factory=lambda: ColdStoreConfig())
    default_policy: SessionPolicy = Field(default_factory=lambda: SessionPolicy())

    @model_validator(mode="after")
    def _unique_names(self) -> KvresConfig:
        names = [b.name for b in self.backends]
        if len(set(names)) != len(names):
            raise ValueError(f"backend names must be unique, got {names}")
        return self

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> KvresConfig:
        """``KVRES_CONFIG`` (a JSON file path or inline JSON) first, then per-field overrides
        applied to every backend: KVRES_MODEL, KVRES_ENGINE, KVRES_N_CTX, KVRES_KV_BUDGET_TOKENS,
        KVRES_N_THREADS, KVRES_TYPE_K, KVRES_TYPE_V."""
        env = os.environ if env is None else env
        raw: dict[str, object] = {}
        source = env.get("KVRES_CONFIG")
        if source:
            text = Path(source).read_text() if not source.lstrip().startswith("{") else source
            raw = json.loads(text)
        overrides = {
            "KVRES_MODEL": "model_path", "KVRES_ENGINE": "engine", "KVRES_N_CTX": "n_ctx",
            "KVRES_KV_BUDGET_TOKENS": "kv_budget_tokens", "KVRES_N_THREADS": "n_threads",
            "KVRES_TYPE_K": "type_k", "KVRES_TYPE_V": "type_v",
        }
        patch = {field: env[var] for var, field in overrides.items() if env.get(var)}
        backends = raw.get("backends") or [{}]
        if not isinstance(backends, list):
            raise ValueError(f"KVRES_CONFIG backends must be a list, got {backends!r}")
        raw["backends"] = [{**b, **patch} for b in backends]
        return cls.model_validate(raw)


__all__ = ["BackendConfig", "ColdStoreConfig", "KvresConfig", "SessionPolicy"]
