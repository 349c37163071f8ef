"""What a person reads fits a 100-column terminal: every line of the default ``tta``, ``train``,
``platforms`` and ``bench`` text and of the demo's ending, on recorded runs (the session's tiny
run, the recorded H200 demo run); ``--wide`` prints every column as before, ``--json`` every key."""
import json
import shutil
from pathlib import Path

import pytest

from speechperf.cli import main
from tests.conftest import TINY_RUN

GPU_DEMO = Path(__file__).parent / "benchmarks/fixtures/gpu_check/runs/demo/run"  # a recorded H200 demo run
WIDE_COLUMNS = ["workload", "machine", "median of", "relative", "RCP check", "init s", "TFLOPS", "platform",
                "TTA x price ($ min)", "energy to accuracy kWh", "time parts", "price note"]


def _lines(capsys, *argv, code: int = 0) -> list[str]:
    assert main([str(a) for a in argv]) == code
    return capsys.readouterr().out.splitlines()


def _narrow(lines: list[str]) -> None:
    too_wide = [line for line in lines if len(line) > 100]
    assert not too_wide, "\n".join(too_wide)


@pytest.mark.parametrize("extra,targets", [([], 3), (["--targets", "90", "--epochs", "1"], 1), (["--metric", "wer"], 3)])
def test_tta_fits_100_columns(tiny_run, capsys, extra, targets):
    """Two machines' runs, reached and never-reached targets."""
    lines = _lines(capsys, "tta", GPU_DEMO, tiny_run, *extra)
    _narrow(lines)
    assert lines[0].split() == ["run", "target", "TTA", "min", "error", "[95%]", "epochs", "MFU", "%", "to",
                                "accuracy", "most", "time"]
    rows = lines[2:2 + 2 * targets]  # a row per target of each run
    assert all("gpu bf16" in r for r in rows[:targets]) and all("tiny" in r for r in rows[targets:])
    if not extra:  # the GPU run reached every paper target: its TTA, interval and rental cost
        assert "1.93" in rows[0] and "5.9 [5.6,6.2]" in rows[0] and "$0.15" in rows[0] and "steps 65%" in rows[0]
        assert "none: unreached" in rows[3]
    assert lines[-1] == "every column and what each means: --wide; every value: --json"


def test_tta_wide_prints_every_column_and_json_every_key(tiny_run, capsys):
    wide = _lines(capsys, "tta", GPU_DEMO, tiny_run, "--wide")
    assert all(c in wide[0] for c in WIDE_COLUMNS) and max(map(len, wide)) > 300
    assert any(line.startswith("Groups: runs of one workload") for line in wide)  # the explanations, whole
    assert "Seeds per group" in "\n".join(wide)
    assert main(["tta", str(GPU_DEMO), str(tiny_run), "--json"]) == 0
    study = json.loads(capsys.readouterr().out)
    assert set(study) == {"runs", "groups", "comparisons", "evaluations"}
    assert all(c in study["runs"][0] for c in [*WIDE_COLUMNS, "time parts s", "minutes", "error at TTA"])
    assert "error [95%]" not in study["runs"][0] and "to accuracy" not in study["runs"][0]


def test_the_reference_curve_note_says_what_to_run(tiny_run, capsys):
    """The tiny preset has reference curves; the session's run was not made under an ISA cap."""
    lines = _lines(capsys, "tta", tiny_run)
    text = " ".join(" ".join(lines).split())
    assert "reference curve not compared:" in text and "rerun with --isa avx2 threads=1" in text


def test_train_text_fits_100_columns(tiny_run, tiny_features, tmp_path, capsys):
    """A finished run, reported again by the command that made it."""
    run = tmp_path / "run"
    shutil.copytree(tiny_run, run)
    lines = _lines(capsys, "train", "--data", tiny_features, "--out", run, *TINY_RUN)
    _narrow(lines)
    assert lines[0].split()[:3] == ["run", "status", "epochs"] and "success" in lines[2]
    assert lines[2].split()[0].endswith("/run") and lines[2].startswith("~")  # a path cut keeps the folder's name


def test_platforms_fits_100_columns(capsys):
    lines = _lines(capsys, "platforms")
    _narrow(lines)
    assert lines[0].split()[0] == "profile" and lines[-1] == "Sources of every price: speechperf platforms --json"


def test_bench_ops_fits_100_columns_and_wide_shows_every_column(tmp_path, capsys):
    """Measured rows and rows not measured (tf32 on a CPU), with their notes."""
    from speechperf.bench.ops import COLUMNS

    argv = ["bench", "ops", "--quick", "--threads", "1", "--iters", "1", "--dtype", "fp32,tf32", "--db", tmp_path / "b.db"]
    lines = _lines(capsys, *argv)
    _narrow(lines)
    assert lines[0].split()[:4] == ["dtype", "thr", "op", "shape"] and any(line.startswith("not measured: ") for line in lines)
    wide = _lines(capsys, *argv, "--wide")
    assert wide[0].split() == list(COLUMNS) and max(map(len, wide)) > 100
