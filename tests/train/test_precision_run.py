"""A precision the CPU only emulates is trained, and said so in the run's env.json,
summary.json and the report's runs table (bf16 units forced off, so on any CPU)."""
import json

from speechperf.cli import main
from speechperf.hardware import capability as cap

EMULATED = "emulated: no native bf16 on this CPU (AVX2)"


def test_an_emulated_precision_is_flagged_in_env_summary_and_report(tiny_features, tmp_path, monkeypatch, capsys):
    from speechperf.studies.report.runs import load_run
    from speechperf.studies.report.run_sections import runs_section
    from speechperf.studies.report.sections import Context
    from speechperf.results.view import RunView

    monkeypatch.setenv(cap.FORCE_ENV, "avx512f,avx512_bf16,amx_bf16")
    run = tmp_path / "run"
    code = main(["train", "--preset", "tiny", "--data", str(tiny_features), "--out", str(run), "--json", "--allow-emulated",
                 "threads=1", "max_epochs=1", "model.name=dnn", "model.hidden=32", "model.layers=2", "train.system.precision=bf16",
                 "train.eval.final_splits=none"])  # the note is the run's, not its final evaluations
    assert code == 0, capsys.readouterr().err
    assert json.loads((run / "summary.json").read_text())["precision_note"] == EMULATED
    assert json.loads((run / "env.json").read_text())["precision_note"] == EMULATED
    with RunView.open(run) as r:
        table = runs_section(Context([load_run(r)], tmp_path, None)).blocks[0]
    assert [(row["precision"], row["precision note"]) for row in table.rows] == [("bf16", EMULATED)]
