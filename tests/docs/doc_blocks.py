"""The fenced code blocks of a Markdown document, and what in them is to be run.

Primitives:
- ``Block(doc, line, info, text)``: one fenced block; ``line`` is the 1-based line of its first
  content line, ``info`` the first word of its info string (``python``, ``bash``, ...).
- ``blocks(path, root) -> list[Block]``: every fenced block of a Markdown file, in order;
  ``fences(lines)``: where each fenced block opens and closes (what ``blocks`` reads, marked or not).
- ``Command(doc, line, text)``; ``commands(block) -> list[Command]``: the commands of a shell block
  (``bash``: every line; ``console``: the lines after a ``$ `` prompt, the rest being their output),
  continuation lines (``\\``) joined, blank lines and comment lines dropped.
- ``python_env(block) -> dict[str, str]``: the environment a python block names in a first-line
  comment shaped like the command that runs it: ``# RAY_ADDRESS=... KVRES_CONFIG=x.json python chat.py``.
- ``RUN_PYTHON``, ``RUN_SHELL``, ``SHOWN``: the info strings the docs use: a ``python`` block runs
  with Python, a ``bash`` or ``console`` block is commands; a ``text`` block (output, a diagram, a
  formula) and a ``yaml`` or ``json`` one (a file's contents) are never run. Any other info string,
  or none, is an ``UnmarkedBlockError``.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

RUN_PYTHON = frozenset({"python"})
RUN_SHELL = frozenset({"bash", "console"})
SHOWN = frozenset({"text", "yaml", "json"})
_FENCE = re.compile(r"^(?P<indent> {0,3})(?P<fence>`{3,})\s*(?P<info>[^`]*)$")
_ENV_HEADER = re.compile(r"^#\s*(?P<env>(?:[A-Za-z_][A-Za-z0-9_]*=\S+\s+)+)python\b")


class UnmarkedBlockError(ValueError):
    """A fenced block whose info string says neither how to run it nor that it is only shown."""


@dataclass(frozen=True)
class Block:
    doc: str  # the document's path relative to the repository root
    line: int
    info: str
    text: str

    @property
    def runs(self) -> bool:
        return self.info in RUN_PYTHON | RUN_SHELL


@dataclass(frozen=True)
class Command:
    doc: str
    line: int
    text: str


def fences(lines: list[str]) -> Iterator[tuple[int, int, re.Match[str]]]:
    """Each fenced block of ``lines``: the index of its opening line, of its closing line
    (``len(lines)`` where it is never closed) and the opening's match (``indent``, ``fence``, ``info``)."""
    i = 0
    while i < len(lines):
        opening = _FENCE.match(lines[i])
        if opening is None:
            i += 1
            continue
        end = i + 1
        while end < len(lines) and not lines[end].strip().startswith(opening["fence"]):
            end += 1
        yield i, end, opening
        i = end + 1


def blocks(path: Path, root: Path) -> list[Block]:
    doc = path.relative_to(root).as_posix()
    found: list[Block] = []
    lines = path.read_text().splitlines()
    for i, end, opening in fences(lines):
        info = opening["info"].strip().split(" ")[0]
        if end == len(lines):
            raise UnmarkedBlockError(f"{doc}:{i + 1}: a code block opened here is never closed")
        if info not in RUN_PYTHON | RUN_SHELL | SHOWN:
            raise UnmarkedBlockError(
                f"{doc}:{i + 1}: code block marked {info or 'with nothing'!r}: mark it ```python or ```bash "
                "(run by tests/docs), ```console ($ lines run, the rest is their output), or ```text, ```yaml, "
                "```json (never run)"
            )
        body = [line[len(opening["indent"]):] for line in lines[i + 1:end]]
        found.append(Block(doc, i + 2, info, "\n".join(body) + "\n"))
    return found


def commands(block: Block) -> list[Command]:
    if block.info not in RUN_SHELL:
        raise ValueError(f"{block.doc}:{block.line}: a {block.info!r} block holds no shell commands")
    out: list[Command] = []
    pending: tuple[int, str] | None = None
    for offset, raw in enumerate(block.text.splitlines()):
        number = block.line + offset
        if pending is None:
            if block.info == "console":
                if not raw.startswith("$ "):
                    continue  # output
                raw = raw[2:]
            stripped = raw.strip()
            if not stripped or stripped.startswith("#"):
                continue
            pending = (number, "")
        start, text = pending
        if raw.rstrip().endswith("\\"):
            pending = (start, text + raw.rstrip()[:-1] + " ")
            continue
        out.append(Command(block.doc, start, (text + raw).strip()))
        pending = None
    if pending is not None:
        raise ValueError(f"{block.doc}:{pending[0]}: the command continues past the end of its block")
    return out


def python_env(block: Block) -> dict[str, str]:
    first = block.text.splitlines()[0] if block.text.strip() else ""
    header = _ENV_HEADER.match(first)
    if header is None:
        return {}
    return dict(pair.split("=", 1) for pair in header["env"].split())
