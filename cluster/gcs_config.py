"""The configuration ``kvres start`` created a namespace's actors with, kept in Ray's GCS.

Primitives:
- ``publish_config(namespace, config)``, ``forget_config(namespace)``.
- ``published_config(namespace) -> KvresConfig | None``: what was published for the namespace;
  drivers should connect with the same backends.

Each needs a connected Ray driver; Ray is imported when one is called, as in ``standing``, which
kvres's command line loads to build its parser.
"""

from __future__ import annotations

from .kvres_config import KvresConfig

STANDING_KV_NAMESPACE = "kvres-standing"  # Ray's internal key-value namespace the configurations live in


def publish_config(namespace: str, config: KvresConfig) -> None:
    from ray.experimental import internal_kv

    internal_kv._internal_kv_put(namespace, config.model_dump_json(), overwrite=True,
                                 namespace=STANDING_KV_NAMESPACE)


def forget_config(namespace: str) -> None:
    from ray.experimental import internal_kv

    internal_kv._internal_kv_del(namespace, namespace=STANDING_KV_NAMESPACE)


def published_config(namespace: str) -> KvresConfig | None:
    """None when the namespace was not started that way, or its configuration is no longer valid
    here (e.g. a model file that has gone)."""
    from ray.experimental import internal_kv

    data = internal_kv._internal_kv_get(namespace, namespace=STANDING_KV_NAMESPACE)
    if data is None:
        return None
    try:
        return KvresConfig.model_validate_json(data)
    except ValueError:
        return None
