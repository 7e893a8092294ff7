"""README is a front door, and every link in the written documentation opens.

README says what the lab is, the two commands, the first ten minutes and a map into docs/, one
topic a file; the detail lives in docs/. These tests hold it there: README stays short, every
relative link in README, docs/ (its subfolders too), the runbooks and the folders' READMEs names
a file that exists and, for a `#anchor` into Markdown, a heading that GitHub renders with that
anchor; and every page of docs/ can be reached from README. (The loopback addresses in the same
files are opened on a live lab by tests/test_lab_e2e.py.)
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from runwatch.core.paths import REPO

README_MAX_LINES = 200  # issue 38: "a front door of about 200 lines at most"

FENCE = re.compile(r"^```.*?^```", re.M | re.S)
LINK = re.compile(r"\]\(([^)\s]+)\)")
HEADING = re.compile(r"^#{1,6} +(.+?) *#*$", re.M)


def docs() -> list[Path]:
    """Every Markdown file a learner reads in the repository (not the vendored packages')."""
    found = [REPO / "README.md", REPO / "SECURITY.md", *sorted((REPO / "docs").rglob("*.md"))]
    found += sorted((REPO / "runbooks").glob("*.md"))
    found += [p for p in sorted(REPO.glob("*/README.md")) if p not in found]
    found += [p for p in sorted(REPO.glob("*/*/README.md")) if "node_modules" not in p.parts]
    return found


def prose(path: Path) -> str:
    """The file without its code blocks: a `#` comment in a shell block is not a heading."""
    return FENCE.sub("", path.read_text())


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"\]\([^)]*\)", "]", heading)  # a link in a heading anchors on its text
    text = re.sub(r"[^\w\- ]", "", text.lower())
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    return {slug(h) for h in HEADING.findall(prose(path))}


def relative_links(path: Path) -> list[str]:
    return [t for t in LINK.findall(prose(path)) if not re.match(r"[a-z]+:", t)]


def broken_links(path: Path) -> list[str]:
    """`target (why)` for each relative link of `path` that does not open."""
    broken = []
    for target in relative_links(path):
        file, _, anchor = target.partition("#")
        dest = (path.parent / file).resolve() if file else path
        if not dest.exists():
            broken.append(f"{target} (no such file)")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target} (no heading #{anchor} in {dest.name})")
    return broken


def test_readme_is_a_front_door_of_at_most_200_lines():
    lines = (REPO / "README.md").read_text().count("\n")
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines: move the detail into docs/"


def test_readme_gives_the_two_commands_the_first_ten_minutes_and_a_map():
    text = (REPO / "README.md").read_text()
    for command in ("make lab", "make test", "docker compose up"):
        assert command in text, command
    headings = [h.lower() for h in HEADING.findall(prose(REPO / "README.md"))]
    assert "the first ten minutes" in headings and "the map" in headings, headings
    assert "docs/lab-guide.md#exercise-1-name-the-core-metrics" in text  # lesson 1, where to begin


@pytest.mark.parametrize("path", docs(), ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_opens(path):
    assert broken_links(path) == []


def test_the_link_checker_finds_a_missing_file_and_a_missing_heading(tmp_path):
    page = tmp_path / "page.md"
    (tmp_path / "other.md").write_text("# Other\n\n## The lab's clock waits\n")
    page.write_text(
        "[ok](other.md#the-labs-clock-waits) [no file](gone.md) [no heading](other.md#nowhere)\n"
        "```sh\n[in code](not-a-link.md)\n```\n[here](#page) [web](https://example.org/x.md)\n# Page\n"
    )
    broken = [b.split(" (")[0] for b in broken_links(page)]
    assert broken == ["gone.md", "other.md#nowhere"]


def test_every_page_of_docs_is_reached_from_readme():
    """Nothing is lost in docs/: each page is linked from README or from a page README leads to."""
    seen, todo = set(), [REPO / "README.md"]
    while todo:
        page = todo.pop()
        if page in seen or page.suffix != ".md" or not page.exists():
            continue
        seen.add(page)
        todo += [(page.parent / t.partition("#")[0]).resolve() for t in relative_links(page) if t.partition("#")[0]]
    pages = set((REPO / "docs").glob("*.md"))
    assert sorted(str(p.relative_to(REPO)) for p in pages - seen) == []
