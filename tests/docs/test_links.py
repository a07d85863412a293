"""The docs point at what exists: every relative link at a file (and a heading, for an
``#anchor``), every repository path they quote at a file or directory, and they speak of
the project only (no issue numbers)."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PAGES = sorted(
    [REPO / "README.md", REPO / "chart" / "README.md", *(REPO / "docs").glob("*.md"), *(REPO / "bench").glob("*.md")]
)
TOP = ("app", "bench", "chart", "dashboards", "docs", "proto", "tests", "tools")
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
QUOTED_PATH = re.compile(rf"`((?:{'|'.join(TOP)})/[^`\s]*)`")
FENCE = re.compile(r"^(```|~~~).*?^\1", re.MULTILINE | re.DOTALL)


def _prose(text: str) -> str:
    """The text without fenced code blocks."""
    return FENCE.sub("", text)


def slug(heading: str) -> str:
    """The anchor GitHub gives a heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    seen: Counter[str] = Counter()
    out = set()
    for m in re.finditer(r"^#{1,6} +(.+?) *#*$", _prose(page.read_text()), re.MULTILINE):
        base = slug(m.group(1))
        out.add(f"{base}-{seen[base]}" if seen[base] else base)
        seen[base] += 1
    return out


def _ids(pages: list[Path]) -> list[str]:
    return [str(p.relative_to(REPO)) for p in pages]


def test_slug_follows_github() -> None:
    assert slug("Which pods hold the device (`--pod-resources on`)") == "which-pods-hold-the-device---pod-resources-on"
    assert slug("CDI: the node's mode (containerd 2.x)") == "cdi-the-nodes-mode-containerd-2x"


@pytest.mark.parametrize("page", PAGES, ids=_ids(PAGES))
def test_relative_links_point_at_files_and_headings(page: Path) -> None:
    broken = []
    for target in LINK.findall(re.sub(r"`[^`\n]*`", "", _prose(page.read_text()))):
        if re.match(r"[a-z]+:", target):
            continue  # https:, mailto:
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            broken.append(f"{target}: no such file")
        elif anchor and file.suffix == ".md" and anchor not in anchors(file):
            broken.append(f"{target}: no heading #{anchor} in {file.relative_to(REPO)}")
    assert not broken, f"{page.relative_to(REPO)}: " + "; ".join(broken)


@pytest.mark.parametrize("page", PAGES, ids=_ids(PAGES))
def test_quoted_repository_paths_exist(page: Path) -> None:
    missing = []
    for quoted in QUOTED_PATH.findall(page.read_text()):
        path = quoted.split("::", 1)[0].rstrip("/")
        if re.search(r"[<>*{}…]", path):
            continue  # a pattern, not a path
        if not (REPO / path).exists():
            missing.append(quoted)
    assert not missing, f"{page.relative_to(REPO)} names paths that do not exist: {missing}"


@pytest.mark.parametrize("page", PAGES, ids=_ids(PAGES))
def test_pages_speak_of_the_project_only(page: Path) -> None:
    found = re.findall(r"\bissue[- ]#?\d+|\(issue \d+|the issue\b", page.read_text(), flags=re.IGNORECASE)
    assert not found, f"{page.relative_to(REPO)} refers to the tracker: {found}"
