"""The docs check (`make test`): README stays a page a newcomer reads in minutes, and every relative link in
README.md, docs/ and the examples' READMEs resolves, to a file that exists and, for a `#fragment` into a
Markdown file, to a heading there (GitHub's anchor rules)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit
REPO = Path(__file__).resolve().parents[2]
README_LIMIT = 15_000  # characters
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^(```|~~~).*?^\1", re.MULTILINE | re.DOTALL)


def documents(repo: Path) -> list[Path]:
    return [repo / "README.md", *sorted((repo / "docs").glob("*.md")), *sorted((repo / "examples").glob("*/README.md"))]


def anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped (hyphens, underscores kept), spaces to hyphens."""
    text = re.sub(r"[`*]", "", heading.strip()).lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(doc: Path) -> set[str]:
    headings = re.findall(r"^#{1,6}\s+(.+?)\s*#*$", FENCE.sub("", doc.read_text(encoding="utf-8")), re.MULTILINE)
    return {anchor(h) for h in headings}


def broken_links(doc: Path) -> list[str]:
    """The relative links of `doc` (outside code blocks) whose target or heading does not exist."""
    broken = []
    for target in LINK.findall(FENCE.sub("", doc.read_text(encoding="utf-8"))):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto: ...: not relative
            continue
        path_part, _, fragment = target.partition("#")
        resolved = (doc.parent / path_part).resolve() if path_part else doc
        if not resolved.exists():
            broken.append(f"{target} (no such file)")
        elif fragment and resolved.suffix == ".md" and fragment not in anchors(resolved):
            broken.append(f"{target} (no heading #{fragment} in {resolved.name})")
    return broken


@pytest.mark.parametrize("doc", documents(REPO), ids=lambda d: str(d.relative_to(REPO)))
def test_every_relative_link_resolves(doc: Path) -> None:
    assert broken_links(doc) == [], f"{doc.relative_to(REPO)} has broken links"


def test_the_readme_stays_within_its_limit() -> None:
    size = len((REPO / "README.md").read_text(encoding="utf-8"))
    assert size <= README_LIMIT, f"README.md is {size} characters, over {README_LIMIT}: move detail into docs/"


def test_the_check_finds_a_broken_file_link_and_a_missing_heading(tmp_path: Path) -> None:
    (tmp_path / "other.md").write_text("# Other\n\n## The hot path, as built\n")
    doc = tmp_path / "doc.md"
    doc.write_text("[ok](other.md#the-hot-path-as-built) [web](https://example.org/x) [self](#top)\n# Top\n"
                   "[gone](missing.md) [bad](other.md#nowhere)\n```\n[in code](not-checked.md)\n```\n")
    assert broken_links(doc) == ["missing.md (no such file)", "other.md#nowhere (no heading #nowhere in other.md)"]
