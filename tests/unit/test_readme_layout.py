"""The README stays short and true: at most 300 lines, its Layout block matches the tree both
ways, and every relative link in README.md and docs/ points at a file (and heading) that exists."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = next(p for p in Path(__file__).resolve().parents if (p / "pyproject.toml").exists())
# Where Python packages live; each package directory under these must be in the Layout block.
PACKAGE_ROOTS = ("src/llm_release", "flows", "tasks", "blocks", "demo")
MAX_README_LINES = 300


def layout_entries(readme: str) -> dict[str, str]:
    """The Layout section's code block: one directory a line (``path/  description``), a
    description continued on indented lines. Returns {path: description}."""
    section = re.search(r"^## Layout\n(.*?)(?=^## |\Z)", readme, re.S | re.M)
    assert section, "README.md has no '## Layout' section"
    block = re.search(r"^```[^\n]*\n(.*?)^```", section.group(1), re.S | re.M)
    assert block, "the Layout section has no code block"
    entries: dict[str, str] = {}
    last = None
    for line in block.group(1).splitlines():
        if not line.strip():
            continue
        if line[0].isspace():
            assert last, f"Layout: continuation line before any entry: {line!r}"
            entries[last] += " " + line.strip()
            continue
        match = re.fullmatch(r"(\S+/)\s+(\S.*)", line)
        assert match, f"Layout: expected 'directory/  description', got {line!r}"
        path, description = match.groups()
        assert path not in entries, f"Layout lists {path} twice"
        entries[path] = description
        last = path
    return entries


def package_dirs(root: Path) -> set[str]:
    """Every directory with an __init__.py under the package roots, as 'path/'."""
    found = set()
    for top in PACKAGE_ROOTS:
        base = root / top
        if not base.is_dir():
            continue
        for init in base.rglob("__init__.py"):
            if "__pycache__" not in init.parts:
                found.add(init.parent.relative_to(root).as_posix() + "/")
    return found


def layout_problems(root: Path, readme: str) -> list[str]:
    entries = layout_entries(readme)
    problems = [f"listed but missing: {p}" for p in entries if not (root / p).is_dir()]
    problems += [f"package not listed: {p}" for p in sorted(package_dirs(root) - set(entries))]
    for path, description in entries.items():
        for module in re.findall(r"[\w-]+\.py\b", description):
            if not (root / path / module).is_file():
                problems.append(f"{path}: names {module}, which is not there")
    return problems


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to '-'."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def _without_code_blocks(text: str) -> str:
    """The text less its fenced code blocks (a '# comment' or '[x](y)' there is code)."""
    return re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)


def anchors(path: Path) -> set[str]:
    headings = re.findall(r"^#{1,6} (.+)$", _without_code_blocks(path.read_text()), re.M)
    return {_slug(h) for h in headings}


def markdown_files(root: Path) -> list[Path]:
    return [root / "README.md", *sorted((root / "docs").rglob("*.md"))]


def broken_links(root: Path) -> list[str]:
    broken = []
    for doc in markdown_files(root):
        if not doc.exists():
            continue
        text = doc.read_text()
        for target in re.findall(r"\]\(([^)\s]+)\)", _without_code_blocks(text)):
            if re.match(r"[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
                continue
            path_part, _, anchor = target.partition("#")
            where = doc if not path_part else (doc.parent / path_part).resolve()
            name = f"{doc.relative_to(root)}: {target}"
            if not where.exists():
                broken.append(f"{name} (no such file)")
            elif anchor and where.suffix == ".md" and anchor not in anchors(where):
                broken.append(f"{name} (no heading with that anchor)")
    return broken


def test_readme_is_at_most_300_lines():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= MAX_README_LINES, f"README.md has {len(lines)} lines; move detail to docs/"


def test_layout_matches_the_tree_both_ways():
    assert layout_problems(ROOT, (ROOT / "README.md").read_text()) == []


def test_layout_lists_every_package_root():
    listed = layout_entries((ROOT / "README.md").read_text())
    for top in PACKAGE_ROOTS:
        if (ROOT / top).is_dir():
            assert f"{top}/" in listed


def test_every_relative_link_in_readme_and_docs_resolves():
    assert broken_links(ROOT) == []


def test_readme_links_every_doc():
    readme = (ROOT / "README.md").read_text()
    missing = [
        p.name for p in sorted((ROOT / "docs").glob("*.md")) if f"(docs/{p.name})" not in readme
    ]
    assert missing == [], f"docs not linked from the README: {missing}"


# The checks themselves: each finds what it is for.

LAYOUT = """# x

## Layout

```
pkg/        the package: a.py
  and more words
data/       some data
```

## Next
"""


@pytest.fixture()
def tree(tmp_path: Path) -> Path:
    (tmp_path / "src/llm_release/sub").mkdir(parents=True)
    (tmp_path / "src/llm_release/__init__.py").write_text("")
    (tmp_path / "src/llm_release/sub/__init__.py").write_text("")
    (tmp_path / "src/llm_release/sub/__pycache__").mkdir()
    (tmp_path / "src/llm_release/data").mkdir()  # no __init__.py: not a package
    (tmp_path / "flows").mkdir()
    (tmp_path / "flows/__init__.py").write_text("")
    (tmp_path / "flows/release.py").write_text("")
    (tmp_path / "docs").mkdir()
    return tmp_path


def test_layout_parser_reads_entries_and_continuations():
    assert layout_entries(LAYOUT) == {
        "pkg/": "the package: a.py and more words",
        "data/": "some data",
    }


def test_layout_check_finds_unlisted_packages_missing_dirs_and_modules(tree):
    readme = """## Layout

```
src/llm_release/   core
flows/             release.py, canary.py
gone/              removed long ago
```
"""
    assert layout_problems(tree, readme) == [
        "listed but missing: gone/",
        "package not listed: src/llm_release/sub/",
        "flows/: names canary.py, which is not there",
    ]


def test_layout_check_passes_an_accurate_block(tree):
    readme = """## Layout

```
src/llm_release/       core
src/llm_release/sub/   a subpackage
src/llm_release/data/  data, not a package
flows/                 release.py
```
"""
    assert layout_problems(tree, readme) == []


def test_link_check_finds_missing_files_and_anchors(tree):
    (tree / "README.md").write_text(
        "[ok](docs/a.md) [`code`](flows/release.py) [web](https://example.com) "
        "[gone](docs/gone.md) [anchor](docs/a.md#the-sizing-llm-release-plan) "
        "[bad anchor](docs/a.md#nowhere)\n\n```\n[in code](nowhere.md)\n```\n"
    )
    (tree / "docs/a.md").write_text(
        "# A\n\n## The sizing (`llm-release plan`)\n\n[back](../README.md) [self](#a) [x](#no)\n"
    )
    assert broken_links(tree) == [
        "README.md: docs/gone.md (no such file)",
        "README.md: docs/a.md#nowhere (no heading with that anchor)",
        "docs/a.md: #no (no heading with that anchor)",
    ]
