"""API keys: where they come from, how a request's key is checked, and where the server may listen.

Primitives:
- ``API_KEYS_ENV`` (``KVRES_API_KEYS``: keys separated by commas or whitespace) and
  ``API_KEY_FILE_ENV`` (``KVRES_API_KEY_FILE``: a file with one key per line, ``#`` comments). A
  key may be followed by ``tenant=LABEL``: the sessions its requests open count against that
  tenant's quotas (``BackendConfig.tenant_quotas``).
- ``load_key_entries(key_file=None, env=None) -> list[(key, tenant or None)]``: the keys of the
  file given, else of the two variables; ``load_keys`` the keys alone. A key shorter than
  ``MIN_KEY_LENGTH`` characters, a ``tenant=`` with no key before it, a bad label, or a file that
  cannot be read is an ``AuthConfigError`` naming it.
- ``key_digests(entries) -> tuple[str, ...]``: SHA-256 hex digests (``HEX`` or ``HEX:tenant``) of
  keys or ``(key, tenant)`` entries; replicas are handed these, never the keys.
- ``KeyCheck(digests)``: ``allows(authorization, api_key) -> bool`` for an ``Authorization: Bearer
  KEY`` (or an ``X-Api-Key: KEY``) header, ``match(...) -> (allowed, tenant)``: the presented key's
  digest compared with every configured digest in constant time (``hmac.compare_digest``; all of
  them compared whatever matches). No digests: every request is allowed (``open``), no tenant.
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

from kvres.actors.config import TENANT_PATTERN
from kvres.policy import KvresError

API_KEYS_ENV = "KVRES_API_KEYS"
API_KEY_FILE_ENV = "KVRES_API_KEY_FILE"
MIN_KEY_LENGTH = 16
LOOPBACK = "127.0.0.1"

log = logging.getLogger("kvres.serve")


class AuthConfigError(KvresError, ValueError):
    """An API key or key file kvres cannot use; the message names which."""


KeyEntry = tuple[str, str | None]
TENANT_PREFIX = "tenant="


def _keys_of(text: str, where: str) -> list[KeyEntry]:
    entries: list[KeyEntry] = []
    for word in (w for line in text.splitlines() for w in re.split(r"[\s,]+", line.split("#", 1)[0]) if w):
        if word.startswith(TENANT_PREFIX):
            label = word[len(TENANT_PREFIX):]
            if not entries or entries[-1][1] is not None:
                raise AuthConfigError(f"{where}: {word!r} follows no key (write KEY tenant=LABEL)")
            if not re.fullmatch(TENANT_PATTERN, label):
                raise AuthConfigError(f"{where}: tenant label {label!r} must match {TENANT_PATTERN}")
            entries[-1] = (entries[-1][0], label)
            continue
        if len(word) < MIN_KEY_LENGTH:
            raise AuthConfigError(f"{where}: an API key must be at least {MIN_KEY_LENGTH} characters, "
                                  f"one has {len(word)}")
        entries.append((word, None))
    return entries


def load_keys(key_file: str | os.PathLike[str] | None = None, env: Mapping[str, str] | None = None) -> list[str]:
    return [key for key, _ in load_key_entries(key_file, env)]


def load_key_entries(key_file: str | os.PathLike[str] | None = None,
                     env: Mapping[str, str] | None = None) -> list[KeyEntry]:
    env = os.environ if env is None else env
    path = key_file or env.get(API_KEY_FILE_ENV) or None
    keys: list[KeyEntry] = []
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


def key_digests(entries: Iterable[str | KeyEntry]) -> tuple[str, ...]:
    out = set()
    for entry in entries:
        key, tenant = (entry, None) if isinstance(entry, str) else entry
        digest = hashlib.sha256(key.encode("utf-8")).hexdigest()
        out.add(digest if tenant is None else f"{digest}:{tenant}")
    return tuple(sorted(out))


def presented_key(authorization: str | None, api_key: str | None) -> str | None:
    if authorization:
        scheme, _, value = authorization.strip().partition(" ")
        if scheme.lower() == "bearer" and value.strip():
            return value.strip()
    return api_key.strip() if api_key else None


class KeyCheck:
    def __init__(self, digests: Iterable[str]) -> None:
        known = [d.partition(":") for d in digests]
        self._digests = tuple((bytes.fromhex(d), tenant or None) for d, _, tenant in known)

    @property
    def open(self) -> bool:
        return not self._digests

    def allows(self, authorization: str | None, api_key: str | None = None) -> bool:
        return self.match(authorization, api_key)[0]

    def match(self, authorization: str | None, api_key: str | None = None) -> tuple[bool, str | None]:
        """(whether the request may pass, the tenant of the key it presented, if any)."""
        if self.open:
            return True, None
        key = presented_key(authorization, api_key)
        if key is None:
            return False, None
        digest = hashlib.sha256(key.encode("utf-8", "surrogateescape")).digest()
        ok, tenant = False, None
        for known, label in self._digests:  # every digest compared: the time says nothing of which matched
            same = hmac.compare_digest(digest, known)
            ok |= same
            tenant = label if same else tenant
        return ok, tenant


def bind_host(host: str, have_keys: bool) -> str:
    if have_keys:
        return host
    asked = "" if host == LOOPBACK else f", not on {host!r} as asked"
    log.warning("kvres serve: no API key configured (%s or %s): anyone on this machine can call it, so it "
                "listens on %s only%s", API_KEYS_ENV, API_KEY_FILE_ENV, LOOPBACK, asked)
    return LOOPBACK
