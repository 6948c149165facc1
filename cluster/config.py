"""Validated configuration (pydantic): the whole cluster's.

Primitives:
- ``SessionPolicy``, ``BackendConfig``: re-exported from ``kvres.actors.config``.
- ``ColdStoreConfig``: RAM and disk byte budgets, disk folder.
- ``PlacementConfig``: where ``open_session`` puts a session it is not told where to put:
  ``kind`` least_loaded / pack / label, ``labels`` (node labels the backend's node must carry);
  ``placement.policy()`` is the pure ``kvres.policy.placement.PlacementPolicy``.
- ``KvresConfig``: the whole thing; ``KvresConfig.from_env(env)`` applies ``KVRES_*`` overrides.

Every bad value is a ``pydantic.ValidationError`` (a ValueError) whose message names the field.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from kvres.actors.config import BackendConfig, SessionPolicy
from kvres.policy.placement import PlacementPolicy

MiB = 1024 * 1024


class ColdStoreConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    ram_budget_bytes: int = Field(256 * MiB, ge=0)
    disk_budget_bytes: int = Field(1024 * MiB, ge=0)
    disk_dir: Path | None = None  # None: a per-node folder under the system temp dir


class PlacementConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["least_loaded", "pack", "label"] = "least_loaded"
    labels: dict[str, str] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _labels_for_label(self) -> PlacementConfig:
        if self.kind == "label" and not self.labels:
            raise ValueError("placement kind 'label' needs labels, e.g. {'zone': 'a'}")
        return self

    def policy(self) -> PlacementPolicy:
        return PlacementPolicy(self.kind, dict(self.labels))


class KvresConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    backends: list[BackendConfig] = Field(default_factory=lambda: [BackendConfig()], min_length=1)
    cold_store: ColdStoreConfig = Field(default_factory=lambda: ColdStoreConfig())
    default_policy: SessionPolicy = Field(default_factory=lambda: SessionPolicy())
    placement: PlacementConfig = Field(default_factory=lambda: PlacementConfig())

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
        KVRES_N_THREADS, KVRES_TYPE_K, KVRES_TYPE_V; KVRES_PLACEMENT sets the placement kind."""
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
        if env.get("KVRES_PLACEMENT"):
            placement = raw.get("placement") or {}
            if not isinstance(placement, dict):
                raise ValueError(f"KVRES_CONFIG placement must be an object, got {placement!r}")
            raw["placement"] = {**placement, "kind": env["KVRES_PLACEMENT"]}
        return cls.model_validate(raw)


__all__ = ["BackendConfig", "ColdStoreConfig", "KvresConfig", "PlacementConfig", "SessionPolicy"]
