"""kvres's settings from the environment (``KVRES_*``), read by pydantic-settings in one place.

Primitives:
- ``KvresSettings``: every process-level setting kvres reads from its environment, one field per
  variable (``KVRES_<FIELD>``, case-insensitive; an empty variable counts as unset):
  ``cache_dir`` (KVRES_CACHE_DIR: models and probe results; None: the user's cache folder),
  ``config`` (KVRES_CONFIG: a KvresConfig as JSON, or a file holding it),
  ``metrics_per_session`` (KVRES_METRICS_PER_SESSION: per-session metric series, off by default
  so a busy cluster's series stay bounded), ``metrics_session_ids`` (KVRES_METRICS_SESSION_IDS:
  plain session ids as their label instead of keyed hashes; implies per-session series),
  ``ray_task_events`` (KVRES_RAY_TASK_EVENTS: Ray's defaults for task events, off by default: the
  clusters kvres starts bound Ray's task-event store and kvres's actors report none,
  ``kvres.cluster.ray_task_events``).
- ``read_settings(env=None) -> KvresSettings``: from ``os.environ``, or from ``env`` alone (tests);
  a value kvres cannot read raises ``SettingsError`` naming the variable and the value.
- ``backend_overrides(env=None) -> dict``: every ``BackendConfig`` field but ``name`` and
  ``node_id`` (one per backend) from ``KVRES_<FIELD>`` (``KVRES_MODEL`` also names
  ``model_path``), read by a pydantic-settings class made from ``BackendConfig``'s fields; byte
  sizes (``kv_memory_bytes``, ``kv_memory_reserve_bytes``) as ``pydantic.ByteSize`` reads them
  ("8GiB", "512 MB"). ``BackendConfig`` itself validates the values.
- ``SettingsError``: a typed ``KvresError`` / ``ValueError``.

Booleans take 1/0, true/false, yes/no, on/off.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from functools import cache
from pathlib import Path
from typing import Any

from pydantic import ByteSize, ValidationError, create_model
from pydantic_settings import BaseSettings, SettingsConfigDict

from kvres.policy.errors import KvresError

ENV_PREFIX = "KVRES_"
PER_BACKEND_FIELDS = ("name", "node_id")  # never one value for every backend
BYTE_FIELDS = ("kv_memory_bytes", "kv_memory_reserve_bytes")


class SettingsError(KvresError, ValueError):
    """A ``KVRES_*`` variable holds something kvres cannot read; names the variable and the value."""


class KvresSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, case_sensitive=False, env_ignore_empty=True,
                                      extra="ignore", frozen=True)

    cache_dir: Path | None = None
    config: str | None = None
    metrics_per_session: bool = False
    metrics_session_ids: bool = False
    ray_task_events: bool = False

    @property
    def per_session_series(self) -> bool:
        return self.metrics_per_session or self.metrics_session_ids


def _variable(field: str) -> str:
    return f"{ENV_PREFIX}{field.upper()}"


def read_settings(env: Mapping[str, str] | None = None) -> KvresSettings:
    try:
        if env is None:
            return KvresSettings()
        fields = set(KvresSettings.model_fields)
        values = {k[len(ENV_PREFIX):].lower(): v for k, v in env.items()
                  if k.upper().startswith(ENV_PREFIX) and k[len(ENV_PREFIX):].lower() in fields and v != ""}
        return KvresSettings.model_validate(values)
    except ValidationError as exc:
        error = exc.errors()[0]
        field = str(error["loc"][0]) if error["loc"] else "?"
        raise SettingsError(f"environment variable {_variable(field)}={error.get('input')!r} is invalid: "
                            f"{error['msg']}") from None


@cache
def _backend_settings() -> type[BaseSettings]:
    from .config import BackendConfig

    fields: dict[str, Any] = {
        name: ((ByteSize | None) if name in BYTE_FIELDS else (str | None), None)
        for name in BackendConfig.model_fields if name not in PER_BACKEND_FIELDS
    }
    model: type[BaseSettings] = create_model(
        "BackendSettings", __base__=BaseSettings, __config__=None, **fields)
    model.model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, case_sensitive=False, env_ignore_empty=True,
                                            extra="ignore")
    model.model_rebuild(force=True)
    return model


def backend_overrides(env: Mapping[str, str] | None = None) -> dict[str, Any]:
    settings = _backend_settings()
    source = os.environ if env is None else env
    upper = {k.upper(): v for k, v in source.items() if v != ""}
    try:
        if env is None:
            values = settings()
        else:
            values = settings.model_validate({name: upper[_variable(name)] for name in settings.model_fields
                                              if _variable(name) in upper})
    except ValidationError as exc:
        error = exc.errors()[0]
        field = str(error["loc"][0]) if error["loc"] else "?"
        raise SettingsError(f"environment variable {_variable(field)}={error.get('input')!r} is invalid: "
                            f"{error['msg']}") from None
    out = {name: (int(v) if name in BYTE_FIELDS else v) for name, v in values.model_dump().items() if v is not None}
    if "model_path" not in out and upper.get("KVRES_MODEL"):
        out["model_path"] = upper["KVRES_MODEL"]
    return out
