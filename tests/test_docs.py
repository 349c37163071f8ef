"""docs/ and the package's docstrings state what is: no commit hash, no date.

A measured figure belongs in benchmarks/ledger.jsonl with its date, commit, machine and command;
a doc or docstring cites its latest value and names its ledger benchmark ("(ledger:
bench_plan)"). A hash or a date in prose ages the text: it invites "before commit X this was
biased" stories that a newcomer has to replay to learn what the code does today. The ledger
itself, the commit log and platform profiles (whose prices carry the date they were read) are
where dates belong, so this test reads only docs/*.md, DEVELOPING.md, README.md and every
docstring under speechperf/.
"""
from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = sorted((ROOT / "docs").glob("*.md")) + [ROOT / "DEVELOPING.md", ROOT / "README.md"]
LEDGER = ROOT / "benchmarks" / "ledger.jsonl"
LEDGER_KEYS = {"date", "commit", "machine", "command", "benchmark", "figures"}

# A commit-like hash: 7 to 40 hex digits holding both a digit and a letter (so neither a plain
# number nor a word spelled in a-f), standing alone (not inside a path, an identifier or a
# longer token).
HASH = re.compile(r"(?<![0-9A-Za-z_/.#-])(?=[0-9a-f]*[0-9])(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}"
                  r"(?![0-9A-Za-z_])")
# An ISO date, day or month: 2026-11-25, 2026-11.
DATE = re.compile(r"\b(?:19|20)\d\d-(?:0[1-9]|1[0-2])(?:-(?:0[1-9]|[12]\d|3[01]))?\b")


def dated(text: str) -> list[str]:
    """The lines of ``text`` that carry a commit-like hash or an ISO date."""
    return [line.strip() for line in text.splitlines() if HASH.search(line) or DATE.search(line)]


def docstrings(path: Path) -> list[tuple[str, str]]:
    """(where, docstring) for the module, class and function docstrings of one source file."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            text = ast.get_docstring(node, clean=False)
            if text:
                out.append((getattr(node, "name", "module"), text))
    return out


@pytest.mark.parametrize("text, hits", [
    ("recorded in commit `86a8b19`", 1), ("commit e587f0d, the 2-core machine", 1),
    ("measured 2026-11-25 on", 1), ("prices of 2019-10", 1), ("sha256 `95fd0b8758a1`", 1),
    ("a 1234567-step run", 0), ("the word deadbeef", 0), ("speechperf/results/run.py", 0),
    ("128 x 1024 = 131072", 0), ("feats/shard-00012.npz", 0), ("(ledger: bench_plan)", 0),
])
def test_the_rule_finds_hashes_and_dates(text, hits):
    assert len(dated(text)) == hits


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_docs_carry_no_hash_or_date(doc):
    lines = dated(doc.read_text(encoding="utf-8"))
    assert not lines, (f"{doc.relative_to(ROOT)} carries a commit hash or date (put the figure in "
                       f"benchmarks/ledger.jsonl and cite '(ledger: NAME)'): {lines}")


def test_docstrings_carry_no_hash_or_date():
    found = [f"{py.relative_to(ROOT)} {where}: {line}"
             for py in sorted((ROOT / "speechperf").rglob("*.py"))
             for where, text in docstrings(py) for line in dated(text)]
    assert not found, "docstrings carrying a commit hash or date:\n" + "\n".join(found)


def test_ledger_lines_are_whole_records():
    for n, line in enumerate(LEDGER.read_text(encoding="utf-8").splitlines(), 1):
        record = json.loads(line)
        assert set(record) == LEDGER_KEYS, f"ledger line {n}: keys {sorted(record)}"
        assert record["benchmark"] and isinstance(record["figures"], dict) and record["figures"], \
            f"ledger line {n}: a benchmark name and its figures"


def test_every_cited_ledger_benchmark_exists():
    names = {json.loads(line)["benchmark"] for line in LEDGER.read_text(encoding="utf-8").splitlines()}
    cite = re.compile(r"ledger: ([^);]+)")  # "(ledger: A, B)", "(...; ledger: A; ...)"
    texts = [(doc.name, doc.read_text(encoding="utf-8")) for doc in DOCS]
    texts += [(py.name, text) for py in sorted((ROOT / "speechperf").rglob("*.py"))
              for _, text in docstrings(py)]
    for name, text in texts:
        for cited in cite.findall(" ".join(text.split())):
            for one in cited.split(", "):
                assert one in names, f"{name} cites ledger benchmark {one!r}, which the ledger lacks"
