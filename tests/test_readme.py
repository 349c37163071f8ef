"""README.md stays a five-minute read that opens with the two commands, and its links hold.

The two commands are the project's entry points (CI's `.ci/run` runs the second), so they
are checked verbatim; every local link of README.md and of docs/*.md must name a file that
exists, so moving a topic's file breaks this test instead of a newcomer's click. The papers'
numbers are cited as "docs/spec.md X": each such citation must name a section of that file.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
MAX_LINES = 250  # the rest lives in docs/, one file per topic
MAX_WORDS = 1000  # as `wc -w` counts them: about five minutes of reading
COMMANDS = ["pip install -c constraints.txt -e . && speechperf demo --out demo",
            "bash scripts/test.sh"]
LINK = re.compile(r"\]\(([^)\s]+)\)")  # [text](target)
SPEC = ROOT / "docs" / "spec.md"
CITATION = re.compile(r"docs/spec\.md ([A-Z])\b")  # "docs/spec.md B": section B of the spec
CITERS = ["README.md", "DEVELOPING.md", "docs", "speechperf", "benchmarks", "tests"]


def _local_links(md: Path) -> list[str]:
    """Link targets of a Markdown file that point into the repository (no URL, no bare anchor),
    without their #anchor."""
    targets = (t.split("#", 1)[0] for t in LINK.findall(md.read_text(encoding="utf-8")))
    return [t for t in targets if t and "://" not in t and not t.startswith("mailto:")]


def test_readme_is_short():
    n = len(README.read_text(encoding="utf-8").splitlines())
    assert n <= MAX_LINES, f"README.md has {n} lines (at most {MAX_LINES}): move a topic to docs/"


def test_readme_is_a_five_minute_read():
    n = len(README.read_text(encoding="utf-8").split())
    assert n <= MAX_WORDS, f"README.md has {n} words (at most {MAX_WORDS}): link the details in docs/"


def test_readme_opens_with_the_two_commands():
    lines = README.read_text(encoding="utf-8").splitlines()
    first_block = lines.index("```bash")
    assert first_block < 5, "the first code block must open the README"
    got = [line.split("#", 1)[0].strip() for line in lines[first_block + 1:first_block + 3]]
    assert got == COMMANDS


def test_ci_runs_the_readme_test_command():
    assert COMMANDS[1] in (ROOT / ".ci" / "run").read_text(encoding="utf-8")


def test_readme_links_every_docs_file_and_each_exists():
    links = _local_links(README)
    for target in links:
        assert (ROOT / target).exists(), f"README.md links {target}, which does not exist"
    linked = {Path(t).as_posix() for t in links}
    for doc in sorted((ROOT / "docs").glob("*.md")):
        assert f"docs/{doc.name}" in linked, f"README.md does not link docs/{doc.name}"
    assert "DEVELOPING.md" in linked


@pytest.mark.parametrize("doc", sorted(p.name for p in (ROOT / "docs").glob("*.md")))
def test_docs_links_exist(doc):
    md = ROOT / "docs" / doc
    for target in _local_links(md):
        assert (md.parent / target).exists(), f"docs/{doc} links {target}, which does not exist"


def _cited_files() -> list[Path]:
    out = []
    for name in CITERS:
        path = ROOT / name
        files = [path] if path.is_file() else sorted(path.rglob("*"))
        out += [f for f in files if f.is_file() and f.suffix in {".md", ".py", ".toml"} and f != Path(__file__)]
    return out


def test_spec_citations_name_a_section_of_docs_spec():
    sections = set(re.findall(r"^## ([A-Z])\. ", SPEC.read_text(encoding="utf-8"), flags=re.M))
    assert sections >= set("ABCDEF"), f"docs/spec.md has sections {sorted(sections)}, not A-F"
    cited = 0
    for f in _cited_files():
        text = f.read_text(encoding="utf-8")
        assert "SPEC.md" not in text, f"{f.relative_to(ROOT)} cites SPEC.md, which is outside the repository"
        for letter in CITATION.findall(text):
            cited += 1
            assert letter in sections, f"{f.relative_to(ROOT)} cites docs/spec.md {letter}: no such section"
    assert cited >= 10  # the code cites the spec: a pattern that matched nothing would pass vacuously
