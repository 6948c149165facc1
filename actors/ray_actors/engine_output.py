"""What a backend's process writes to its stderr while it starts, kept in a file that outlives the
process: native code that gives up (llama.cpp's ``GGML_ASSERT``, a C++ exception, a fatal signal)
writes its reason there and ends the process, with no Python exception to carry it.

Primitives:
- ``captured_stderr() -> Iterator[Captured]``: file descriptor 2 (Python's ``sys.stderr`` and
  native code alike) goes to a new private file (``Captured.path``) while the block runs;
  ``Captured.stderr`` still writes to the real one (progress lines an operator watches);
  ``Captured.said()`` is what was written so far. Afterwards
  what was written is copied to the real stderr and the file removed. When the process dies
  inside, the file stays.
- ``last_words(text) -> str``: the line of ``text`` that says why: an assertion or abort of
  llama.cpp, a C++ exception's ``what()``, a fatal error; else a line naming an error; else the
  last line. Source paths lose their folders.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

# strongest first: the line a native failure prints before the backtrace that follows it
_SAYS_WHY = (
    re.compile(r"GGML_ASSERT|GGML_ABORT|terminate called|what\(\):|Fatal Python error|Segmentation fault"),
    re.compile(r"\berror\b|\bfailed\b|\babort", re.IGNORECASE),
)
_SOURCE_FOLDERS = re.compile(r"\S*/([^/\s:]+:\d+)")
MAX_WORDS = 300


@dataclass(frozen=True)
class Captured:
    path: Path
    stderr: TextIO

    def said(self) -> str:
        """What the process has written to fd 2 so far."""
        sys.stderr.flush()
        try:
            return self.path.read_text(errors="replace")
        except OSError:
            return ""


@contextlib.contextmanager
def captured_stderr() -> Iterator[Captured]:
    fd, name = tempfile.mkstemp(prefix="kvres-start-", suffix=".err")  # readable by this user only
    path = Path(name)
    sys.stderr.flush()
    saved = os.dup(2)
    os.dup2(fd, 2)
    os.close(fd)
    real = open(os.dup(saved), "w", buffering=1, closefd=True)  # noqa: SIM115 (closed below)
    try:
        yield Captured(path, real)
    finally:
        sys.stderr.flush()
        real.close()
        os.dup2(saved, 2)
        os.close(saved)
        with contextlib.suppress(OSError):
            said = path.read_bytes()
            path.unlink()
            if said:
                os.write(2, said)  # where it would have gone: the worker's log


def last_words(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if not lines:
        return ""
    for pattern in _SAYS_WHY:
        found = next((line for line in lines if pattern.search(line)), None)
        if found is not None:
            break
    else:
        found = lines[-1]
    return _SOURCE_FOLDERS.sub(r"\1", found)[:MAX_WORDS]
