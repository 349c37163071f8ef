"""benchmarks/run.py, the suite's one entry, and benchmarks/_ledger.py, the ledger it appends to:
every benchmark tied to a goal of a doc that exists, the names the docs and messages cite
registered, a real run's printed ratio and its ledger line, the ledger's lines whole."""
from __future__ import annotations

import importlib
import json
import re
import sys
from pathlib import Path

import pytest

from tests.conftest import run_benchmark

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
runner = importlib.import_module("run")
ledger = importlib.import_module("_ledger")
timing = importlib.import_module("_timing")


def test_every_benchmark_names_its_goal_in_a_doc_that_exists(capsys):
    assert runner.main(["--list"]) == 0
    out = capsys.readouterr().out
    for name, module in runner.SUITE.items():
        mod = importlib.import_module(module)
        docs = re.findall(r"docs/[\w-]+\.md", mod.GOAL)
        assert docs and all((ROOT / d).is_file() for d in docs), (name, mod.GOAL)
        assert mod.REFERENCE and mod.RATIO and isinstance(mod.DATA, bool)
        assert f"{name}\n  goal: {mod.GOAL}\n" in out
    assert len(list((ROOT / "benchmarks").glob("bench_*.py"))) == len(runner.SUITE)  # no script outside the runner


def test_the_benchmarks_the_docs_and_messages_cite_are_registered():
    cited = set()
    for path in [*ROOT.glob("docs/*.md"), ROOT / "README.md", ROOT / "DEVELOPING.md", *ROOT.glob("speechperf/**/*.py"),
                 ROOT / "benchmarks" / "gpu_check.sh"]:
        text = path.read_text()
        name = r"([a-z_][a-z0-9_]*)"  # fp8's digit too
        cited |= set(re.findall(r"benchmarks/run\.py " + name, text)) | set(re.findall(r"`run\.py " + name, text))
        assert not re.search(r"benchmarks/bench_\w+\.py", text) or path.suffix == ".md", path  # code runs the runner
    assert cited and cited <= set(runner.SUITE), cited - set(runner.SUITE)


def test_a_run_prints_its_ratio_and_appends_its_line(tmp_path, capsys):
    path = tmp_path / "ledger.jsonl"
    path.write_text('{"a line": "from before"}\n')
    assert run_benchmark("graph_shapes", "--ledger", path, "--epochs", "1", "--grids", "64x32") == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("== graph_shapes: docs/gpu.md: ")
    ratio = re.fullmatch(r"graph_shapes: shapes at the coarsest grid given / at 16x8 = ([\d.]+) \(reference: .*\)", out[-1])
    lines = path.read_text().splitlines()
    assert len(lines) == 2 and lines[0] == '{"a line": "from before"}'  # appended, the file's lines kept
    line = json.loads(lines[1])
    assert list(line) == list(ledger.KEYS) and line["benchmark"] == "bench_graph_shapes"
    assert line["command"] == "python benchmarks/run.py graph_shapes --epochs 1 --grids 64x32"
    assert ratio and float(ratio.group(1)) == pytest.approx(line["figures"]["ratio"], abs=1e-3)
    assert 0 < line["figures"]["ratio"] < 1  # a coarser grid: fewer shapes
    assert [r["grid frames x utterances"] for r in line["figures"]["rows"]] == ["16x8", "64x32"]
    assert set(line["figures"]["versions"]) == {"name", "hardware", "python", "torch", "cuda"}  # _timing.machine()
    assert line["machine"] == line["figures"]["versions"]["name"] and re.fullmatch(r"\d{4}-\d\d-\d\dT.*Z", line["date"])
    assert line["commit"] is None or re.fullmatch(r"[0-9a-f]{7,}", line["commit"])  # git's, where there is a checkout


def test_the_ledger_keeps_features_by_name_and_refuses_a_partial_line(tmp_path):
    assert runner.placeholders(["--data", "/some/where/feats", "--preset", "gpu"]) == ["--data", "FEATS", "--preset", "gpu"]
    assert runner.placeholders(["--data=/x"]) == ["--data=FEATS"]
    with pytest.raises(ValueError, match="lacks figures"):
        ledger.append({k: None for k in ledger.KEYS if k != "figures"}, tmp_path / "l.jsonl")
    assert not (tmp_path / "l.jsonl").exists()
    for n in (1, 2):
        ledger.append({"date": "d", "commit": None, "machine": "m", "command": "c", "benchmark": "b", "figures": {"n": n}},
                      tmp_path / "l.jsonl")
    assert ledger.latest("b", tmp_path / "l.jsonl")["figures"] == {"n": 2} and ledger.latest("c", tmp_path / "l.jsonl") is None


def test_the_shared_timing_warms_up_then_times_each_call():
    calls = []
    m = timing.measure(lambda: calls.append(1), repeats=3, warmup=2, device="cpu")
    assert len(calls) == 5 and m["min"] <= m["median"] <= m["max"]
    assert timing.spread([1.0, 2.0, 4.0]) == {"median": 2.0, "min": 1.0, "max": 4.0, "spread_pct": 150.0}


def test_the_shipped_ledger_has_whole_lines():
    for line in ledger.read():
        assert list(line) == list(ledger.KEYS) and isinstance(line["figures"], dict), line


@pytest.mark.parametrize("argv,says", [([], "name a benchmark"), (["nope"], "invalid choice: 'nope'"),
                                       (["plan", "mfu", "--repeats", "2"], "only --data FEATS")])
def test_bad_runner_input_exits_2(argv, says, capsys):
    with pytest.raises(SystemExit) as e:
        runner.main(argv)
    assert e.value.code == 2 and says in capsys.readouterr().err
