"""What a namespace asks every backend to run inside its own process, kept in Ray's GCS.

Primitives:
- ``publish_hosted(namespace, entry, spec)``, ``published_hosted(namespace) -> (entry, spec) | None``,
  ``withdraw_hosted(namespace)``: ``entry`` names a callable as ``"module:function"``, ``spec`` is
  the text it is given.
- ``start_hosted(server, name, namespace) -> Any``: where something is published, ``entry``
  imported and called as ``entry(server, name, namespace, spec)`` (it returns what the backend
  holds: an object with ``ready()`` and ``stop()``); None where nothing is.
- ``NothingHostedError``: asked to host where nothing is published (names the namespace).

Why a name and not an import: ``kvres serve --front local`` runs its HTTP front inside each backend's
process (``kvres.cluster.serve.colocated_front``), and the actors do not import the layers above
them; kept in the GCS, it is hosted again by a backend that Ray restarts.
"""

from __future__ import annotations

import importlib
import json
from typing import Any

from kvres.policy import KvresError

HOSTED_KV_NAMESPACE = "kvres-hosted"


class NothingHostedError(KvresError):
    """A backend asked to host what its namespace has not published."""


def publish_hosted(namespace: str, entry: str, spec: str) -> None:
    from ray.experimental import internal_kv

    internal_kv._internal_kv_put(namespace, json.dumps({"entry": entry, "spec": spec}), overwrite=True,
                                 namespace=HOSTED_KV_NAMESPACE)


def published_hosted(namespace: str) -> tuple[str, str] | None:
    from ray.experimental import internal_kv

    data = internal_kv._internal_kv_get(namespace, namespace=HOSTED_KV_NAMESPACE)
    if data is None:
        return None
    fields = json.loads(data)
    return str(fields["entry"]), str(fields["spec"])


def withdraw_hosted(namespace: str) -> None:
    from ray.experimental import internal_kv

    internal_kv._internal_kv_del(namespace, namespace=HOSTED_KV_NAMESPACE)


def start_hosted(server: Any, name: str, namespace: str) -> Any:
    published = published_hosted(namespace)
    if published is None:
        return None
    entry, spec = published
    module, _, function = entry.partition(":")
    return getattr(importlib.import_module(module), function)(server, name, namespace, spec)
