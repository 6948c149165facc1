"""Validated configuration (pydantic): the whole cluster's.

Primitives:
- ``SessionPolicy``, ``BackendConfig``, ``TenantQuota``: re-exported from ``kvres.actors.config``.
- ``ColdStoreConfig``: RAM and disk byte budgets, disk folder.
- ``PlacementConfig``: where ``open_session`` puts a session it is not told where to put:
  ``kind`` least_loaded / pack / label, ``labels`` (node labels the backend's node must carry);
  ``placement.policy()`` is the pure ``kvres.policy.placement.PlacementPolicy``.
- ``KvresConfig``: the whole thing; ``KvresConfig.from_env(env)`` applies ``KVRES_*`` overrides.
- ``ConfigEnvError``: ``KVRES_CONFIG`` is not a JSON object nor a path to a file holding one, or
  its JSON is malformed or not shaped like a configuration; the message names the variable.
- ``json_object(value, name, shown, error) -> (object, where)``: a JSON object given inline or as
  the path of a file holding one (``KVRES_CONFIG``, ``kvres start --config``).

Every bad value is a ``pydantic.ValidationError`` (a ValueError) whose message names the field.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from kvres.actors.config import BackendConfig, SessionPolicy, TenantQuota
from kvres.policy.errors import KvresError
from kvres.policy.placement import PlacementPolicy

MiB = 1024 * 1024


class ColdStoreConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    ram_budget_bytes: int = Field(256 * MiB, ge=0)
    disk_budget_bytes: int = Field(1024 * MiB, ge=0)
    disk_dir: Path | None = None  # None: a per-node folder in the user's private cache (0700)


class ConfigEnvError(KvresError, ValueError):
    """``KVRES_CONFIG`` holds something kvres cannot use; the message names the variable."""


def json_object(value: str, name: str, shown: str, error: type[KvresError]) -> tuple[dict[str, object], str]:
    """The JSON object ``value`` holds inline (it starts with ``{`` or ``[``) or in the file it
    names, and where it was read from (``name``, or ``name`` file 'path'), for messages. ``shown``:
    how the value reads in a message (``KVRES_CONFIG='...'``, ``--config '...'``). Anything else is
    ``error``, naming ``name`` and what it must be."""
    text = value.strip()
    must = f"{name} must be a JSON object (inline) or a path to a file holding one"
    if text[:1] in ("{", "["):
        where = name
    else:
        path = Path(text).expanduser()
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError as exc:
            raise error(f"{shown} names a file that is not UTF-8 text (byte {exc.start}): {must}") from None
        except OSError as exc:
            raise error(
                f"{shown} is neither a JSON object nor a path to a readable file ({exc.strerror or exc}): {must}"
            ) from exc
        where = f"{name} file {str(path)!r}"
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise error(f"{where} is not valid JSON: {exc}") from exc
    if not isinstance(raw, dict):
        raise error(f"{where} holds a JSON {type(raw).__name__}, {text[:80]!r}: {must}")
    return raw, where


def _config_from_env_var(source: str) -> dict[str, object]:
    """The JSON object ``KVRES_CONFIG`` holds inline or names a file of."""
    raw, where = json_object(source, "KVRES_CONFIG", f"KVRES_CONFIG={source!r:.200}", ConfigEnvError)
    backends = raw.get("backends", [{}])
    if not isinstance(backends, list) or not backends or not all(isinstance(b, dict) for b in backends):
        raise ConfigEnvError(
            f"{where}: backends must be a non-empty list of backend objects, got {backends!r:.200}"
        )
    placement = raw.get("placement", {})
    if not isinstance(placement, dict):
        raise ConfigEnvError(f"{where}: placement must be an object, got {placement!r:.200}")
    return raw


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
        """``KVRES_CONFIG`` (a JSON object inline, or a path to a file holding one) first, then
        per-field overrides applied to every backend: ``KVRES_<FIELD>`` for every ``BackendConfig``
        field but name / node_id (``KVRES_MODEL`` names the model path; byte sizes read as
        ``pydantic.ByteSize``: ``KVRES_KV_MEMORY_BYTES=8GiB``; ``kvres.actors.settings``);
        KVRES_PLACEMENT sets the placement kind. Without ``backends`` the configuration has the default backend; an
        empty or malformed ``backends`` is a ``ConfigEnvError``, never the default."""
        from kvres.actors.settings import backend_overrides, read_settings

        source = read_settings(env).config or ""
        raw = _config_from_env_var(source) if source.strip() else {}
        patch = backend_overrides(env)
        env = os.environ if env is None else env
        backends = raw.get("backends", [{}])
        assert isinstance(backends, list)  # checked by _config_from_env_var
        raw["backends"] = [{**b, **patch} for b in backends]
        if env.get("KVRES_PLACEMENT"):
            placement = raw.get("placement", {})
            assert isinstance(placement, dict)
            raw["placement"] = {**placement, "kind": env["KVRES_PLACEMENT"]}
        return cls.model_validate(raw)


__all__ = ["BackendConfig", "ColdStoreConfig", "ConfigEnvError", "KvresConfig", "PlacementConfig", "SessionPolicy",
           "TenantQuota"]
