"""Session files on the driver's disk: where ``Session.export`` writes and ``SessionManager.restore`` reads.

Primitives:
- ``SessionFileError`` (a ``KvresError`` and an ``OSError``): a path that names no file the session
  can be written to or read from; the message names the path and why.
- ``export_target(path) -> Path``: the file ``path`` names, checked before the session is asked for
  its bytes (not a str or path, empty, ``.``, a directory, in a folder that does not exist: refused).
- ``write_session_file(target, data)``: all of ``data`` at ``target`` or, refused, nothing (no
  partial file: it is written beside the target and renamed over it).
- ``read_session_file(path) -> bytes``: a session file's bytes.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from pathlib import Path

from kvres.policy import ArgumentError, KvresError


class SessionFileError(KvresError, OSError):
    """A session file's path names no file that can be written (export) or read (restore)."""


def _path_of(path: object) -> tuple[Path, str]:
    """``path`` as a ``Path``, and how messages show it; refused where no file could have its name."""
    if not isinstance(path, (str, os.PathLike)):
        raise ArgumentError(f"path must be a str or a path, got {type(path).__name__} {path!r}")
    text = os.fspath(path)
    if not isinstance(text, str):
        raise ArgumentError(f"path must be a str or a path of str, got {type(text).__name__} {text!r}")
    shown = repr(text)
    if "\0" in text:
        raise SessionFileError(f"path {shown} holds a NUL character, which no file name can")
    target = Path(text)
    if target.name in ("", "..") or text.endswith(("/", os.sep)):  # '', '.', '..', '/', 'dir/': no file named
        raise SessionFileError(f"path {shown} names a directory, not a file")
    return target, shown


def export_target(path: str | os.PathLike[str]) -> Path:
    target, shown = _path_of(path)
    try:
        if target.is_dir():
            raise SessionFileError(f"path {shown} is a directory: give a file name inside it")
        folder = target.parent
        if not folder.is_dir():
            missing = "does not exist" if not folder.exists() else "is not a directory"
            raise SessionFileError(f"cannot write the session to path {shown}: its folder {str(folder)!r} {missing}")
    except OSError as exc:  # a name the system refuses outright (too long, ...)
        if isinstance(exc, SessionFileError):
            raise
        raise SessionFileError(f"cannot write the session to path {shown}: {exc.strerror or exc}") from exc
    return target


def write_session_file(target: Path, data: bytes) -> None:
    tmp = target.with_name(f".{target.name}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        with open(tmp, "xb") as f:
            f.write(data)
        os.replace(tmp, target)
    except OSError as exc:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise SessionFileError(f"cannot write the session to path {str(target)!r}: {exc.strerror or exc}") from exc


def read_session_file(path: str | os.PathLike[str]) -> bytes:
    target, shown = _path_of(path)
    try:
        return target.read_bytes()
    except OSError as exc:
        raise SessionFileError(f"cannot read a session file at path {shown}: {exc.strerror or exc}") from exc
