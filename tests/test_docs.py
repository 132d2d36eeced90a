"""The documentation holds together: every relative link in the README and docs/ reaches a file, and
every ``#anchor`` a heading of it (as GitHub makes anchors)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").rglob("*.md")])
# 25,000 until the README showed the first command's output on the default model (SmolLM2, issue 76);
# 26,500 until it said which disk its cold start was measured on and showed spec_decode's cases (issue 92).
README_MAX_BYTES = 27_000
# [text](target), outside code spans; images too.
_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
_CODE = re.compile(r"```.*?```|`[^`\n]*`", re.DOTALL)


def anchors(page: Path) -> set[str]:
    """GitHub's anchors for the page's headings: lower-cased, punctuation dropped, spaces to
    hyphens, a repeated heading numbered from -1."""
    found: set[str] = set()
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.DOTALL)
    for heading in re.findall(r"(?m)^#{1,6} +(.+?) *#*$", text):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        candidate, n = slug, 0
        while candidate in found:
            n += 1
            candidate = f"{slug}-{n}"
        found.add(candidate)
    return found


def links(page: Path) -> list[str]:
    return _LINK.findall(_CODE.sub("", page.read_text()))


def test_anchors_follow_githubs_rule() -> None:
    page = ROOT / "README.md"
    assert "coming-from-worker-vllm" in anchors(page)
    assert "pod-mode-an-openai-compatible-server" in anchors(page)


@pytest.mark.parametrize("page", PAGES, ids=[p.relative_to(ROOT).as_posix() for p in PAGES])
def test_every_relative_link_reaches_its_file_and_heading(page: Path) -> None:
    broken = []
    for target in links(page):
        if re.match(r"[a-z]+:", target):  # http(s), mailto: not this test's to check
            continue
        path_part, _, anchor = target.partition("#")
        path = (page.parent / path_part).resolve() if path_part else page
        if not path.exists():
            broken.append(f"{target}: no such file")
        elif anchor and path.suffix == ".md" and anchor not in anchors(path):
            broken.append(f"{target}: no such heading")
    assert broken == []
