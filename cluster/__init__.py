"""kvres.cluster: what drivers touch.

Primitives: ``connect``, ``SessionManager``, ``Session``; configuration ``KvresConfig``,
``BackendConfig``, ``ColdStoreConfig``, ``SessionPolicy``, ``TenantQuota``; ``SessionFileError`` (a session
file that cannot be written or read back: ``Session.export`` / ``SessionManager.restore``). Importing this package does not start
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
    "SessionFileError",
    "SessionManager",
    "SessionPolicy",
    "TenantQuota",
    "connect",
]


def __getattr__(name: str) -> object:
    if name in ("connect", "Session", "SessionManager"):
        from . import session

        return getattr(session, name)
    if name == "SessionFileError":
        from .session_files import SessionFileError

        return SessionFileError
    raise AttributeError(f"module 'kvres.cluster' has no attribute {name!r}")
