"""Secrets a kvres cluster keeps in memory only: in Ray's GCS key-value store, never on disk.

Primitives:
- ``cluster_secret(name, make) -> bytes``: the bytes stored under ``name``, made once by
  ``make()`` in whichever process asks first; every later caller on the same Ray cluster (another
  driver, a restarted actor) gets the same bytes.
- ``forget_secret(name)``: remove it (the next ``cluster_secret`` makes a new one).
- ``coldstore_secret_name(namespace)`` and ``METRICS_LABEL_SECRET``: the names kvres uses.

The values live in the GCS's memory (and in Redis only where GCS fault tolerance is configured) and
end with the cluster. Whoever can run code on the cluster can read them, as they can read the
actors' memory; they keep secrets from those who can only read the cold-store folders or scrape
the metrics endpoint. Needs a connected Ray worker (a driver after ``ray.init``, or an actor).
"""

from __future__ import annotations

from collections.abc import Callable

KV_NAMESPACE = "kvres-secrets"
METRICS_LABEL_SECRET = "metrics-session-labels"


def coldstore_secret_name(namespace: str) -> str:
    return f"coldstore/{namespace}"


def cluster_secret(name: str, make: Callable[[], bytes]) -> bytes:
    from ray.experimental import internal_kv

    internal_kv._internal_kv_put(name, make(), overwrite=False, namespace=KV_NAMESPACE)
    value = internal_kv._internal_kv_get(name, namespace=KV_NAMESPACE)
    if value is None:  # pragma: no cover - removed between the two calls
        return cluster_secret(name, make)
    return bytes(value)


def forget_secret(name: str) -> None:
    from ray.experimental import internal_kv

    internal_kv._internal_kv_del(name, namespace=KV_NAMESPACE)
