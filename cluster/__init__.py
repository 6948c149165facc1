"""kvres.cluster: what drivers touch.

Primitives: ``connect``, ``SessionManager``, ``Session``; configuration ``KvresConfig``,
``BackendConfig``, ``ColdStoreConfig``, ``SessionPolicy``, ``TenantQuota``. Importing this package does not start
Ray; ``connect`` does.
"""

from .kvres_config import (
    BackendConfig,
    ColdStoreConfig,
    KvresConfig,
    PlacementConfig,
    SessionPolicy,
    TenantQuota,
)

__all__ = [
    "BackendConfig",
    "ColdStoreConfig",
    "KvresConfig",
    "PlacementConfig",
    "Session",
    "SessionManager",
    "SessionPolicy",
    "TenantQuota",
    "connect",
]


def __getattr__(name: str) -> object:
    if name in ("connect", "Session", "SessionManager"):
        from . import session

        return getattr(session, name)
    raise AttributeError(f"module 'kvres.cluster' has no attribute {name!r}")
