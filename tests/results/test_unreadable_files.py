"""Every reader of a run refuses a damaged JSON file of its folder by name, with exit 2:
``tta``, ``report``, ``eval``, ``beam-sweep`` and ``demo`` read a run folder through
``Run.open``, which reads config.json, env.json and summary.json before anything is shown
(a report of a run whose summary is cut short must not show it as a success)."""
import json

import pytest

from speechperf.cli import main
from speechperf.results.run import Run

CONFIG = {"preset": "tiny", "model": {"name": "ds2"}, "train": {"seed": 1, "eval_split": "dev-clean"}}
ENV = {"cpu_model": "Test CPU", "cpu_cores_logical": 2, "gpus": []}


def _damaged_run(folder, name: str):
    with Run.create(folder, kind="train", config=CONFIG, env=ENV, label="damaged") as run:
        run.rows.set_status("success")
        run.write_summary({"status": "success", "init_s": 1.0})
    (folder / name).write_text('{"status": "success", "init_')  # cut short mid-write
    return folder


def _argv(reader: str, run, tmp_path) -> list[str]:
    return {"tta": ["tta", str(run)], "report": ["report", str(run), "--out", str(tmp_path / "rep")],
            "eval": ["eval", str(run)], "beam-sweep": ["beam-sweep", str(run), "--widths", "1"],
            "demo": ["demo", "--out", str(run.parent), "--preset", "tiny"]}[reader]


@pytest.mark.parametrize("name", ["summary.json", "config.json", "env.json"])
@pytest.mark.parametrize("reader", ["tta", "report", "eval", "beam-sweep", "demo"])
def test_every_reader_refuses_a_damaged_file_by_name(reader, name, tmp_path, capsys, monkeypatch):
    def no_synthesis(*a, **k):  # the demo must refuse before minutes of corpus synthesis
        raise AssertionError("the demo synthesized a corpus before checking its run folder")

    monkeypatch.setattr("speechperf.corpus.synth.synthesize", no_synthesis)
    run = _damaged_run(tmp_path / "demo" / "run", name)
    assert main(_argv(reader, run, tmp_path)) == 2
    err = capsys.readouterr().err
    assert f"{run / name}: not valid JSON" in err, err
    assert not (tmp_path / "rep" / "index.html").exists()


def test_a_json_file_that_is_not_an_object_is_refused(tmp_path, capsys):
    run = _damaged_run(tmp_path / "run", "env.json")
    (run / "env.json").write_text(json.dumps(["not", "an", "object"]))
    assert main(["tta", str(run)]) == 2
    assert f"{run / 'env.json'}: not a JSON object (found list)" in capsys.readouterr().err


# ---- valid JSON of the wrong shape (results/shapes.py) -----------------------------------
@pytest.mark.parametrize("name,content,field", [
    ("config.json", {"train": "x"}, "'train' should be an object, found str 'x'"),
    ("env.json", {**ENV, "gpus": ["H100"]}, "'gpus[0]' should be an object, found str 'H100'"),
    ("env.json", {**ENV, "libraries": {"torch": 2}}, "'libraries.torch' should be a string or null, found int"),
    ("summary.json", {"status": "success", "clock_min": "7"}, "'clock_min' should be an integer or a number or null"),
    ("summary.json", {"status": "success", "epochs": True}, "'epochs' should be an integer or a number or null, found bool"),
    ("run.json", {"format": 2, "run_id": ["r"]}, "'run_id' should be a string, found list"),
    ("env.json", {"train": "x"}, "'train' is not one of env.json's, and none of them is here"),  # issue 48
    ("summary.json", {"train": "x"}, "'status' is missing"),
])
@pytest.mark.parametrize("reader", ["tta", "report"])
def test_valid_json_of_the_wrong_shape_is_refused_naming_file_and_field(reader, name, content, field, tmp_path,
                                                                        capsys):
    run = _damaged_run(tmp_path / "demo" / "run", "summary.json")
    run.joinpath("summary.json").write_text(json.dumps({"status": "success", "init_s": 1.0}))
    run.joinpath(name).write_text(json.dumps(content))
    assert main(_argv(reader, run, tmp_path)) == 2
    err = capsys.readouterr().err
    assert f"{run / name}: field {field}" in err, err
    assert "Traceback" not in err and not (tmp_path / "rep" / "index.html").exists()


def test_shapes_check_only_present_fields_and_any_field_of_a_section():
    from speechperf.results.shapes import SPECS, ShapeError, check_shape

    check_shape({}, SPECS["env.json"], "w")  # an older release's fewer fields
    check_shape({"model": {"name": "ds2", "lstm_hidden": 32, "dropout": 0.1}}, SPECS["config.json"], "w")
    with pytest.raises(ShapeError, match=r"w: field 'model.name' should be"):
        check_shape({"model": {"name": {"x": 1}}}, SPECS["config.json"], "w")


# ---- an integer of more digits than Python converts (4,300): json's ValueError, no JSONDecodeError
HUGE = "1" * 5000


@pytest.mark.parametrize("name,content", [
    ("summary.json", '{"status": "success", "init_s": %s}' % HUGE), ("config.json", '{"preset": %s}' % HUGE),
    ("env.json", '{"cpu_cores_logical": %s}' % HUGE), ("run.json", '{"format": %s, "run_id": "r"}' % HUGE),
    ("sentences.jsonl", '{"iteration": %s}\n' % HUGE),
])
@pytest.mark.parametrize("reader", ["tta", "report"])
def test_an_integer_too_long_to_convert_is_refused_naming_the_file(reader, name, content, tmp_path, capsys):
    if (reader, name) == ("tta", "sentences.jsonl"):
        pytest.skip("tta shows no sentences")
    run = _damaged_run(tmp_path / "demo" / "run", "summary.json")
    run.joinpath("summary.json").write_text(json.dumps({"status": "success", "init_s": 1.0}))
    run.joinpath(name).write_text(content)
    assert main(_argv(reader, run, tmp_path)) == 2
    err = capsys.readouterr().err
    assert f"{run / name}: " in err and "4300 digits" in err and err.count("\n") == 1, err
