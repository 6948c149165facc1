"""Private folders: where a cold store may keep its files.

Primitives:
- ``private_dir(path) -> Path``: create ``path`` (and any missing parent) with mode 0700, then
  check it; raises ``UnsafeStoreDirError`` naming the path and the reason when the folder
  - is a symbolic link (never followed: it could point anywhere),
  - is not a directory,
  - is owned by another user than this process's effective user,
  - grants any permission to group or others (mode & 0o077),
  - or sits in a parent folder another user could change: one owned by neither this user nor
    root, or writable by group or others without the sticky bit (as ``/tmp`` has).
  A folder that exists already is checked, never repaired: a pre-made 0777 folder is refused, not
  chmod-ed, since someone else may already hold files or descriptors in it.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from .errors import UnsafeStoreDirError


def _create_missing(path: Path) -> None:
    missing: list[Path] = []
    probe = path
    while not os.path.lexists(probe) and probe != probe.parent:
        missing.append(probe)
        probe = probe.parent
    for folder in reversed(missing):
        try:
            os.mkdir(folder, 0o700)
        except FileExistsError:
            pass  # made meanwhile by someone else: checked below like any existing folder
        except OSError as exc:
            raise UnsafeStoreDirError(
                str(path), f"creating {folder} failed: {exc.strerror or exc} (errno {exc.errno})"
            ) from exc


def private_dir(path: str | os.PathLike[str]) -> Path:
    folder = Path(os.path.abspath(path))
    _create_missing(folder)
    me = os.geteuid()
    try:
        st = os.lstat(folder)
    except OSError as exc:
        raise UnsafeStoreDirError(str(folder), f"cannot stat it: {exc.strerror or exc}") from exc
    if stat.S_ISLNK(st.st_mode):
        raise UnsafeStoreDirError(
            str(folder), f"it is a symbolic link (to {os.readlink(folder)!r}); kvres never follows one"
        )
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafeStoreDirError(str(folder), "it is not a directory")
    if st.st_uid != me:
        raise UnsafeStoreDirError(
            str(folder), f"it is owned by uid {st.st_uid}, not by this user (uid {me})"
        )
    mode = stat.S_IMODE(st.st_mode)
    if mode & 0o077:
        raise UnsafeStoreDirError(
            str(folder),
            f"its mode is {mode:#o}: group or others can access it; make it 0700 "
            f"(chmod 700 {folder}) or choose another folder",
        )
    parent = os.stat(folder.parent)
    if parent.st_uid not in (me, 0):
        raise UnsafeStoreDirError(
            str(folder),
            f"its parent {folder.parent} is owned by uid {parent.st_uid}, who could replace it",
        )
    if parent.st_mode & 0o022 and not parent.st_mode & stat.S_ISVTX:
        raise UnsafeStoreDirError(
            str(folder),
            f"its parent {folder.parent} (mode {stat.S_IMODE(parent.st_mode):#o}) is writable by "
            "group or others without the sticky bit, so they could replace it",
        )
    return folder
