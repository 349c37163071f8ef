"""The CLI explains itself: choices from the registries, defaults in --help, the parallel
sweep's options under ``speechperf parallel sweep --help``."""
import subprocess
import sys

import pytest

from speechperf.cli import build_parser, main


def _help(capsys, *argv) -> str:
    with pytest.raises(SystemExit) as e:
        build_parser().parse_args([*argv, "--help"])
    assert e.value.code == 0
    return " ".join(capsys.readouterr().out.split())


def test_help_shows_registry_choices_and_defaults(capsys):
    from speechperf.bench.zoo import ZOO
    from speechperf.config import preset_names
    from speechperf.decode import DECODERS

    text = _help(capsys, "eval")
    assert "CTC decoder: " + ", ".join(sorted(DECODERS)) in text and "(default: wordbeam)" in text
    assert "(default: 256)" in text and "(default: 0)" in text
    text = _help(capsys, "train")
    assert all(p in text for p in preset_names()) and "(default: auto)" in text and "--label" in text
    text = _help(capsys, "bench", "zoo")
    assert ", ".join(sorted(ZOO)) in text
    assert "--sync-every" in _help(capsys, "parallel", "sweep") and "--set KEY=VALUE" in _help(capsys, "parallel", "sweep")


def test_the_parser_reads_no_registry_until_its_names_are_shown():
    """Every command's parser is built for any command: the registries' names (presets: torch;
    decoders: numba) are read only when a help text shows them or an argument is checked."""
    code = ("import sys; from speechperf.cli import build_parser; build_parser().parse_args(['tta', 'RUN']); "
            "print(sorted(m for m in ('torch', 'numba') if m in sys.modules))")
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout == "[]\n"


def test_bad_choices_are_refused_naming_them(capsys):
    for argv, said in ((["bench", "zoo", "--models", "resnet50,alexnet"], "alexnet not among"),
                       (["bench", "ops", "--dtype", "fp8"], "fp8 not among"),
                       (["train", "--preset", "huge", "--out", "x"], "unknown preset 'huge'"),
                       (["eval", "run", "--decoder", "magic"], "invalid choice: 'magic'")):
        with pytest.raises(SystemExit) as e:
            main(argv)
        assert e.value.code == 2 and said in capsys.readouterr().err


def test_every_command_has_its_place_in_the_help_and_every_place_a_command():
    from speechperf.cli import COMMANDS, GROUPS, ORDER

    tops = [c.group or c.name for c in COMMANDS]
    assert sorted(ORDER) == sorted(set(tops))  # ORDER: the order --help lists them in
    assert set(GROUPS) == {c.group for c in COMMANDS} - {None}
    names = [(c.group, c.name) for c in COMMANDS]
    assert len(names) == len(set(names))


def test_a_train_summary_as_text_is_one_narrow_row_a_run_and_every_field_in_json(capsys):
    import json
    from pathlib import Path

    from speechperf.cli.train_commands import _emit_summaries

    summary = json.loads((Path(__file__).parent / "benchmarks/fixtures/gpu_check/runs/demo/run/summary.json").read_text())
    shared = {"shared": True, "contended %": 34.0, "others % mean": 40.0, "samples": 600, "first s": 3.0,
              "last s": 200.0, "threads": 2, "cpus": 2}
    summary = {**summary, "floor": {"loop_over_floor": 1.07}, "mfu_note": "peak: a datasheet's", "shared": shared}
    _emit_summaries([summary, {**summary, "floor": None, "mfu_note": None, "shared": None}], as_json=False)
    header, _, first, second, note, shared_note = capsys.readouterr().out.splitlines()
    assert header.split() == ["run", "status", "epochs", "iters", "min", "shared", "cer", "wer", "ser", "mfu", "%",
                              "loop/floor"]
    assert first.split()[-1] == "1.07" and second.split()[-1] == "NA" and len(first) <= 100  # nested records stay out
    assert "yes 34%" in first  # the flag beside the run's clock (telemetry/contention.py)
    assert note == f"note: {summary['run']}: peak: a datasheet's"
    assert shared_note == f"note: {summary['run']}: shared its machine (34% of its clock): rerun it alone"
    _emit_summaries([{"seed": 3, **summary}], as_json=False)  # --seeds: the seed first
    assert capsys.readouterr().out.split()[:2] == ["seed", "run"]
    _emit_summaries([summary], as_json=True)
    assert json.loads(capsys.readouterr().out) == [summary]


def test_a_train_row_shows_the_status_word_and_its_reason_as_a_note():
    from speechperf.cli.train_commands import _status_columns

    assert _status_columns("diverged: non-finite loss at iteration 10") == {
        "status": "diverged", "status_note": "diverged: non-finite loss at iteration 10"}
    assert _status_columns("success") == {"status": "success", "status_note": None}
    assert _status_columns(None) == {"status": None, "status_note": None}  # NA in the row, not "None"


def test_help_speaks_to_a_user_and_lists_every_command_in_a_section(capsys):
    from speechperf.cli import ORDER, SECTIONS

    with pytest.raises(SystemExit) as e:
        main(["--help"])
    out = capsys.readouterr().out
    assert e.value.code == 0 and out.splitlines()[0] == "usage: speechperf [-h] [--version] COMMAND ..."
    assert "speechperf measures how fast a machine trains" in out and "Command line:" not in out
    assert sorted(n for _, names in SECTIONS for n in names) == sorted(ORDER)  # each command once
    for title, names in SECTIONS:
        assert f"\n{title}:\n" in out and all(f"\n  {n} " in out for n in names)
    assert max(map(len, out.splitlines())) <= 100


def test_version_is_the_package_version(capsys):
    from importlib.metadata import version

    from speechperf.cli import version as cli_version

    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0 and capsys.readouterr().out == f"speechperf {cli_version()}\n"
    assert cli_version() == version("speechperf")


class _GoneReader:
    """stdout whose reader went away (``| head``): every write and flush is EPIPE; its descriptor a pipe's."""

    def __init__(self):
        self.read_end, self.write_end = __import__("os").pipe()

    def fileno(self):
        return self.write_end

    def write(self, text):
        raise BrokenPipeError(32, "Broken pipe")

    flush = write


def test_a_reader_that_goes_away_ends_the_command_with_141_and_no_traceback(tmp_path, monkeypatch, capsys):
    import os

    from speechperf.results.run import Run

    with Run.create(tmp_path / "run", kind="train", config={"preset": "tiny", "model": {"name": "ds2"}},
                    env={"cpu_model": "Test CPU"}, label="r") as run:
        run.rows.set_status("success")
        run.write_summary({"status": "success", "init_s": 1.0})
    gone = _GoneReader()
    monkeypatch.setattr(sys, "stdout", gone)
    assert main(["tta", str(tmp_path / "run")]) == 141  # 128 + SIGPIPE, as a process the signal ends
    assert "Traceback" not in capsys.readouterr().err
    os.write(gone.write_end, b"x")  # the descriptor now /dev/null's: the pipe never sees it
    os.close(gone.write_end)
    assert os.read(gone.read_end, 10) == b""
    os.close(gone.read_end)
