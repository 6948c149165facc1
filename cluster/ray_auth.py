"""Ray's token authentication, as this process speaks it.

Primitives:
- ``follow_local_token()``: Ray's own rule for a cluster it finds on this machine, applied to an
  explicit address too: with ``RAY_AUTH_MODE`` unset, a token on this machine
  (``~/.ray/auth_token``, ``RAY_AUTH_TOKEN``, ``RAY_AUTH_TOKEN_PATH``) turns it on.
- ``token_auth()``: whether this process speaks to Ray with token authentication.
- ``exposed_token_file() -> Path | None``: Ray's token file (``RAY_AUTH_TOKEN_PATH``, else
  ``~/.ray/auth_token``) when users other than its owner may read it (Ray writes it with the
  process umask, 0644 under a 0755 folder on many machines).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path


def follow_local_token() -> None:
    """``ray start --head`` decides the same way, so this process can join the head it has just
    started; a token sent to a cluster without authentication is ignored."""
    if "RAY_AUTH_MODE" in os.environ:
        return
    try:
        from ray._private.authentication.authentication_token_setup import (
            maybe_enable_token_auth_if_token_available,
        )
    except ImportError:  # a Ray without token authentication
        return
    maybe_enable_token_auth_if_token_available(warn_if_disabled=False)


def token_auth() -> bool:
    return os.environ.get("RAY_AUTH_MODE", "").lower() == "token"


def exposed_token_file() -> Path | None:
    path = Path(os.environ.get("RAY_AUTH_TOKEN_PATH") or Path.home() / ".ray" / "auth_token")
    try:
        mode = path.stat().st_mode
    except OSError:
        return None
    return path if mode & (stat.S_IRGRP | stat.S_IROTH) else None
