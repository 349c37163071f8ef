"""benchmarks/cpu_check.sh: every command its plan runs parses (the benchmarks' own parsers, the CLI's),
ONLY and CURVES pick steps, and a real run of one step writes its log and the summary."""
import importlib
import os
import shlex
import subprocess
import sys
from pathlib import Path

from speechperf.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
run = importlib.import_module("run")


def plan(tmp_path, **env) -> dict[str, list[str]]:
    out = subprocess.run(["bash", str(ROOT / "benchmarks" / "cpu_check.sh"), "--plan"], capture_output=True, text=True,
                         env={**os.environ, "OUT": str(tmp_path / "out"), "FEATS": "/f", **env}, check=True).stdout
    return {name: shlex.split(cmd) for name, cmd in (line.split(": ", 1) for line in out.splitlines())}


def test_every_planned_command_parses(tmp_path):
    steps = plan(tmp_path, CURVES="1")
    assert list(steps)[:6] == ["env", "features", "reproduce_tiny", "reproduce_cpu", "reproduce_conformer-cpu",
                               "reproduce_transducer-cpu"]
    assert {"curves_cpu", "op_trace", "mfu", "ctc", "lstm_ceiling", "pad_multiple"} <= set(steps)
    for name, cmd in steps.items():
        if cmd[1:3] == ["-m", "speechperf"]:
            build_parser().parse_args(cmd[3:])
        elif cmd[1] == "benchmarks/run.py":
            bench = cmd[2]
            assert bench in run.SUITE, name
            run.bench_parser(bench, importlib.import_module(run.SUITE[bench])).parse_intermixed_args(cmd[3:])
        else:
            assert cmd[:2] == ["bash", "-c"], name


def test_only_and_curves_pick_the_steps(tmp_path):
    assert "curves_cpu" not in plan(tmp_path)  # curves only when asked
    assert list(plan(tmp_path, ONLY="reproduce_c op", CURVES="1")) == [
        "reproduce_cpu", "reproduce_conformer-cpu", "op_trace"]


def test_a_step_runs_logged_and_summarized(tmp_path):
    out = tmp_path / "out"
    done = subprocess.run(["bash", str(ROOT / "benchmarks" / "cpu_check.sh")], capture_output=True, text=True,
                          env={**os.environ, "OUT": str(out), "FEATS": str(tmp_path / "f"), "ONLY": "env",
                               "PY": sys.executable}, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    log = (out / "logs" / "env.log").read_text()
    assert "torch " in log and log.splitlines()[-1].startswith("exit 0 after ")
    summary = (out / "summary.md").read_text()
    assert summary.startswith("# CPU check ") and "- env: " in summary and "failed" not in summary
