"""Every link between the project's documents leads somewhere: each relative markdown link of the
checked-in ``*.md`` files names a file of the repository, and its ``#anchor`` a heading of that file
(GitHub's slug of it) or an ``<a id="...">`` there.

Primitives:
- ``heading_slug(text) -> str``: the anchor GitHub gives a heading (lower case, punctuation but
  ``-`` and ``_`` dropped, spaces made hyphens; a repeated heading gets ``-1``, ``-2``, ...).
- ``anchors_of(markdown) -> set[str]``; ``links_of(markdown) -> [(line, target)]`` (code blocks and
  inline code skipped: their brackets are code, not links).

Why: the documents move text between each other (issue #46 moved its run diary from serving.md to
notes.md), and a link left behind reads as a dead end; the docs must also never lead out of the
repository.
"""

from __future__ import annotations

import functools
import re
import subprocess
from pathlib import Path

import pytest

from tests.docs.doc_blocks import fences

ROOT = Path(__file__).resolve().parents[2]
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")  # a link, or an image (``![...](...)``)
HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$")
HTML_ANCHOR = re.compile(r"<a\s+(?:id|name)=\"([^\"]+)\"")
INLINE_CODE = re.compile(r"`[^`]*`")


def heading_slug(text: str) -> str:
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)  # a heading's link reads as its text
    text = text.strip().lower().replace("`", "")
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def _prose_lines(markdown: str) -> list[tuple[int, str]]:
    lines = markdown.splitlines()
    fenced = {i for start, end, _ in fences(lines) for i in range(start, end + 1)}
    return [(i + 1, line) for i, line in enumerate(lines) if i not in fenced]


def anchors_of(markdown: str) -> set[str]:
    anchors: set[str] = set()
    seen: dict[str, int] = {}
    for _, line in _prose_lines(markdown):
        anchors.update(HTML_ANCHOR.findall(line))
        heading = HEADING.match(line)
        if heading:
            slug = heading_slug(heading.group(1))
            count = seen.get(slug, 0)
            seen[slug] = count + 1
            anchors.add(slug if count == 0 else f"{slug}-{count}")
    return anchors


def links_of(markdown: str) -> list[tuple[int, str]]:
    found = []
    for number, line in _prose_lines(markdown):
        prose = INLINE_CODE.sub("", line)
        found += [(number, target) for target in LINK.findall(prose)]
    return found


@functools.cache
def _anchors_in(document: Path) -> set[str]:
    return anchors_of(document.read_text())


def _documents() -> list[Path]:
    listed = subprocess.run(["git", "ls-files", "*.md"], cwd=ROOT, capture_output=True, text=True, check=True)
    return [ROOT / name for name in listed.stdout.split()]


def test_heading_slugs_follow_github() -> None:
    assert heading_slug("The latest figures") == "the-latest-figures"
    assert heading_slug("The front: `--front local`, `direct` or `serve`") == "the-front---front-local-direct-or-serve"
    assert heading_slug("A core beside the engine; threads chosen (2026-12-07, evening)") == \
        "a-core-beside-the-engine-threads-chosen-2026-12-07-evening"
    assert heading_slug("Positions (policy/positions.py)") == "positions-policypositionspy"
    assert anchors_of("# Errors\n\n## Errors\n```text\n# not a heading\n```\n") == {"errors", "errors-1"}
    assert links_of("see [a](b.md#c), `[x](y)` and\n```\n[z](w)\n```\n![p](q.png)") == [(1, "b.md#c"), (5, "q.png")]


@pytest.mark.parametrize("document", _documents(), ids=lambda path: str(path.relative_to(ROOT)))
def test_links_lead_to_files_and_headings_of_the_repository(document: Path) -> None:
    text = document.read_text()
    broken = []
    for number, target in links_of(text):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:: not a file of the repository
            continue
        path, _, anchor = target.partition("#")
        linked = (document.parent / path).resolve() if path else document
        where = f"{document.relative_to(ROOT)}:{number}: {target}"
        if not linked.is_relative_to(ROOT):
            broken.append(f"{where} leads out of the repository")
        elif not linked.exists():
            broken.append(f"{where}: no such file")
        elif anchor and linked.suffix == ".md" and anchor not in _anchors_in(linked):
            broken.append(f"{where}: no heading or anchor #{anchor} in {linked.relative_to(ROOT)}")
    assert not broken, "\n".join(broken)
