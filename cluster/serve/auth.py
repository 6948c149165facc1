"""API keys: where they come from, how a request's key is checked, and where the server may listen.

Primitives:
- ``API_KEYS_ENV`` (``KVRES_API_KEYS``: keys separated by commas or whitespace) and
  ``API_KEY_FILE_ENV`` (``KVRES_API_KEY_FILE``: a file with one key per line, ``#`` comments).
- ``load_keys(key_file=None, env=None) -> list[str]``: the keys of the file given, else of the two
  variables; a key shorter than ``MIN_KEY_LENGTH`` characters or a file that cannot be read is an
  ``AuthConfigError`` naming it.
- ``key_digests(keys) -> tuple[str, ...]``: SHA-256 hex digests; replicas are handed these, never
  the keys.
- ``KeyCheck(digests)``: ``allows(header_value) -> bool`` for an ``Authorization: Bearer KEY`` (or
  an ``X-Api-Key: KEY``) header: the presented key's digest compared with every configured digest
  in constant time (``hmac.compare_digest``; all of them compared whatever matches). No digests:
  every request is allowed (``open``).
- ``bind_host(host, have_keys) -> str``: the address to listen on: without a key only 127.0.0.1,
  whatever was asked (logged as a warning).
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path

from kvres.policy import KvresError

API_KEYS_ENV = "KVRES_API_KEYS"
API_KEY_FILE_ENV = "KVRES_API_KEY_FILE"
MIN_KEY_LENGTH = 16
LOOPBACK = "127.0.0.1"

log = logging.getLogger("kvres.serve")


class AuthConfigError(KvresError, ValueError):
    """An API key or key file kvres cannot use; the message names which."""


def _keys_of(text: str, where: str) -> list[str]:
    keys = [k for line in text.splitlines() for k in re.split(r"[\s,]+", line.split("#", 1)[0]) if k]
    short = [k for k in keys if len(k) < MIN_KEY_LENGTH]
    if short:
        raise AuthConfigError(f"{where}: an API key must be at least {MIN_KEY_LENGTH} characters, "
                              f"one has {len(short[0])}")
    return keys


def load_keys(key_file: str | os.PathLike[str] | None = None, env: Mapping[str, str] | None = None) -> list[str]:
    env = os.environ if env is None else env
    path = key_file or env.get(API_KEY_FILE_ENV) or None
    keys: list[str] = []
    if path:
        try:
            text = Path(path).expanduser().read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise AuthConfigError(f"API key file {str(path)!r} cannot be read: {exc}") from None
        keys = _keys_of(text, f"API key file {str(path)!r}")
        if not keys:
            raise AuthConfigError(f"API key file {str(path)!r} holds no key")
    if not key_file:
        keys += _keys_of(env.get(API_KEYS_ENV, ""), API_KEYS_ENV)
    return keys


def key_digests(keys: Iterable[str]) -> tuple[str, ...]:
    return tuple(sorted({hashlib.sha256(k.encode("utf-8")).hexdigest() for k in keys}))


def presented_key(authorization: str | None, api_key: str | None) -> str | None:
    if authorization:
        scheme, _, value = authorization.strip().partition(" ")
        if scheme.lower() == "bearer" and value.strip():
            return value.strip()
    return api_key.strip() if api_key else None


class KeyCheck:
    def __init__(self, digests: Iterable[str]) -> None:
        self._digests = tuple(bytes.fromhex(d) for d in digests)

    @property
    def open(self) -> bool:
        return not self._digests

    def allows(self, authorization: str | None, api_key: str | None = None) -> bool:
        if self.open:
            return True
        key = presented_key(authorization, api_key)
        if key is None:
            return False
        digest = hashlib.sha256(key.encode("utf-8", "surrogateescape")).digest()
        ok = False
        for known in self._digests:  # every digest compared: the time says nothing of which matched
            ok |= hmac.compare_digest(digest, known)
        return ok


def bind_host(host: str, have_keys: bool) -> str:
    if have_keys:
        return host
    asked = "" if host == LOOPBACK else f", not on {host!r} as asked"
    log.warning("kvres serve: no API key configured (%s or %s): anyone on this machine can call it, so it "
                "listens on %s only%s", API_KEYS_ENV, API_KEY_FILE_ENV, LOOPBACK, asked)
    return LOOPBACK
