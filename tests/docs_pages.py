"""The documentation's Markdown pages (README.md and docs/**/*.md), for the tests that run or
check what they show: console sessions, code blocks, the architecture map, the ACL example."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
README = ROOT / "README.md"
HEADING = re.compile(r"^(#{1,6})[ \t]+(.+?)[ \t]*$", re.MULTILINE)
FENCE_LINE = re.compile(r"^(```|~~~)", re.MULTILINE)


def pages() -> list[Path]:
    """Every page of the docs site, in a stable order (the site's own folder of hooks left
    out)."""
    return sorted(p for p in DOCS.rglob("*.md") if "hooks" not in p.relative_to(DOCS).parts)


def rel(path: Path) -> str:
    """``path`` as the tests name it: relative to the repository."""
    return path.relative_to(ROOT).as_posix()


def _headings(text: str) -> list[tuple[int, int, str]]:
    """(offset, level, title) of each heading outside code blocks."""
    fenced, spans, start = False, [], 0
    for m in FENCE_LINE.finditer(text):
        if not fenced:
            start = m.start()
        else:
            spans.append((start, m.end()))
        fenced = not fenced
    out = []
    for m in HEADING.finditer(text):
        if not any(a <= m.start() < b for a, b in spans):
            out.append((m.start(), len(m.group(1)), m.group(2)))
    return out


def section(title: str) -> tuple[Path, str]:
    """The one page whose heading (any level) reads ``title``, and the text under that heading
    up to the next heading of the same or a higher level."""
    found = []
    for page in pages():
        text = page.read_text(encoding="utf-8")
        heads = _headings(text)
        for i, (at, level, name) in enumerate(heads):
            if name == title:
                end = next((a for a, lv, _ in heads[i + 1 :] if lv <= level), len(text))
                found.append((page, text[text.index("\n", at) + 1 : end]))
    assert len(found) == 1, f"{len(found)} docs pages have a heading {title!r}: " + ", ".join(
        rel(p) for p, _ in found
    )
    return found[0]
