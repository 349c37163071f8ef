"""A run folder from another machine is data: reading it (tta, report, export, check-log,
reproduce's judging) never imports a module it names (``model.name=MODULE:NAME`` in its
config.json: ``this:x`` printed the Zen of Python); what an analysis needs (the workload: the
model's name and parameters) is recorded in run.json when the run is made. A command that needs
the model class (``eval``, ``beam-sweep``, ``train --resume RUN``) imports it only where the
command line names the module (``--trust-model MODULE``), else exit 2 naming it. And
``python -m speechperf`` run inside such a folder does not put it first on the Python path."""
import json
import sys

import pytest
import torch

from speechperf.cli import main
from speechperf.config import ConfigError, load_preset
from speechperf.models import MODELS, external
from speechperf.results import checkpoint
from speechperf.results.run import Run
from speechperf.results.view import RunView
from speechperf.results.workload import _describe

PLANTED = "planted_model"  # the module a folder from elsewhere names; importing it leaves a marker
ENV = {"cpu_model": "Test CPU", "cpu_cores_logical": 2, "gpus": []}


@pytest.fixture
def planted(tmp_path, monkeypatch):
    """A module on the Python path that leaves ``RAN`` when imported (what a hostile folder would name)."""
    site = tmp_path / "site"
    site.mkdir()
    (site / f"{PLANTED}.py").write_text(f"open({str(tmp_path / 'RAN')!r}, 'w').write('imported')\n")
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setattr(external, "_TRUSTED", set(), raising=False)
    _describe.cache_clear()
    yield tmp_path / "RAN"
    sys.modules.pop(PLANTED, None)
    _describe.cache_clear()


def _run(folder, model: dict, workload: dict | None = "recorded"):
    """A finished run whose config names ``model``; ``workload`` None: run.json as a release before
    this one wrote it (no workload recorded)."""
    config = {"preset": "tiny", "model": model, "train": {"seed": 1, "eval_split": "dev-clean"}}
    with Run.create(folder, kind="train", config={**config, "model": {"name": "ds2"}}, env=ENV, label="copied") as run:
        run.rows.set_status("success")
        run.write_summary({"status": "success", "init_s": 1.0})
    (folder / "config.json").write_text(json.dumps(config))  # what the machine it came from wrote
    info = json.loads((folder / "run.json").read_text())
    if model.get("name") != "ds2":
        info["workload"] = {"model": str(model["name"]).rpartition(":")[2], "params": None}
    if workload is None:
        info.pop("workload")
    elif workload != "recorded":
        info["workload"] = workload
    (folder / "run.json").write_text(json.dumps(info))
    return folder


@pytest.mark.parametrize("recorded", [{"model": "enc", "params": 1234567}, None])
def test_reading_a_folder_that_names_a_module_never_imports_it(planted, tmp_path, capsys, recorded):
    run = _run(tmp_path / "run", {"name": f"{PLANTED}:enc", "hidden": 3}, recorded)
    assert main(["tta", str(run), "--json"]) == 0
    row = json.loads(capsys.readouterr().out)["runs"][0]  # one row per target of the paper set
    assert row["workload"] == ("enc, 1.23 M params" if recorded else "enc")  # recorded, else the name alone
    assert main(["report", str(run), "--out", str(tmp_path / "report")]) == 0
    assert main(["check-log", str(run)]) in (0, 1, 2)  # this folder has no events.log to check: refused, by name
    with RunView.open(run) as view:
        assert view.workload == (recorded or {"model": "enc", "params": None})
    assert not planted.exists() and PLANTED not in sys.modules


def test_a_new_run_records_its_workload_and_readers_read_it_back(tmp_path):
    tiny = {"name": "ds2", "conv_channels": 8, "lstm_layers": 1, "lstm_hidden": 8}
    with Run.create(tmp_path / "run", kind="train", config={"model": tiny}, env=ENV) as run:
        pass
    recorded = json.loads((tmp_path / "run" / "run.json").read_text())["workload"]
    assert recorded["model"] == "ds2" and recorded["params"] > 0
    with RunView.open(tmp_path / "run") as view:
        assert view.workload == recorded
    old = _run(tmp_path / "old", tiny, workload=None)  # a folder recorded before: a built-in model is built
    with RunView.open(old) as view:
        assert view.workload == recorded


def test_an_entry_point_name_is_not_looked_up_when_reading(tmp_path, monkeypatch):
    """A name that is no built-in is shown as recorded: reading imports no installed plugin either."""
    monkeypatch.setattr(MODELS, "_loaded", False)  # as in a fresh process: nothing looked up yet
    monkeypatch.setattr(MODELS, "_load_entry_points", lambda: pytest.fail("entry points loaded while reading"))
    _describe.cache_clear()
    run = _run(tmp_path / "run", {"name": "someones_encoder"}, workload=None)
    with RunView.open(run) as view:
        assert view.workload == {"model": "someones_encoder", "params": None}


def _checkpointed(folder, model: dict):
    """A run with a checkpoint whose config names ``model`` (eval and a resume read the model from it)."""
    run = _run(folder, model)
    feats = folder.parent / "feats"
    feats.mkdir(exist_ok=True)
    (feats / "features.json").write_text("{}")
    config = json.loads((folder / "config.json").read_text())
    torch.save({checkpoint.FORMAT_KEY: checkpoint.FORMAT, checkpoint.CONFIG: config}, folder / "checkpoint.pt")
    return run, feats


@pytest.mark.parametrize("command", ["eval", "beam-sweep", "resume"])
def test_a_command_that_needs_the_model_refuses_an_untrusted_module_naming_it(planted, tmp_path, capsys, command):
    run, feats = _checkpointed(tmp_path / "run", {"name": f"{PLANTED}:enc"})
    argv = {"eval": ["eval", str(run), "--data", str(feats)],
            "beam-sweep": ["beam-sweep", str(run), "--data", str(feats), "--widths", "1"],
            "resume": ["train", "--resume", str(run), "--data", str(feats)]}[command]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"names model '{PLANTED}:enc'" in err and f"--trust-model {PLANTED}" in err, err
    assert not planted.exists() and PLANTED not in sys.modules
    assert main([*argv, "--trust-model", PLANTED]) == 2  # trusted: imported, and refused as what it is
    assert planted.exists() and f"module '{PLANTED}' registers no model 'enc'" in capsys.readouterr().err


def test_continuing_a_folder_of_another_module_is_told_by_its_name(planted, tmp_path, capsys):
    run, feats = _checkpointed(tmp_path / "run", {"name": f"{PLANTED}:enc"})
    assert main(["train", "--preset", "tiny", "--out", str(run), "--data", str(feats)]) == 2
    err = capsys.readouterr().err
    assert f"model.name: '{PLANTED}:enc' there, 'ds2' now" in err and not planted.exists()


def test_a_module_that_prints_while_importing_leaves_stdout_to_the_command(tmp_path, monkeypatch, capsys):
    from pathlib import Path

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "models"))
    try:
        cfg = load_preset("tiny", ["model.name=printing_model:ext_printing"])
        captured = capsys.readouterr()
        assert cfg.model.name == "printing_model:ext_printing" and captured.out == ""
        assert "printing_model: loaded" in captured.err  # shown, on stderr: train --json stays JSON
    finally:
        for name in [k for k, v in MODELS.items() if v.build.__module__ in ("printing_model", "external_model")]:
            del MODELS[name]
        for mod in ("printing_model", "external_model"):
            sys.modules.pop(mod, None)


def test_a_config_whose_problems_raises_is_named_with_the_exception(monkeypatch):
    from pathlib import Path

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "models"))
    try:
        with pytest.raises(ConfigError, match=r"model 'external_model:ext_raising_problems': its config's problems\(\) "
                                              r"raises AttributeError: 'RaisingProblemsConfig' object has no attri"):
            load_preset("tiny", ["model.name=external_model:ext_raising_problems"])
    finally:
        for name in [k for k, v in MODELS.items() if v.build.__module__ == "external_model"]:
            del MODELS[name]
        sys.modules.pop("external_model", None)


def test_python_m_speechperf_inside_a_folder_does_not_run_its_py_files(tmp_path):
    """A fresh interpreter (the path is set up at its start; a forked one has imported everything):
    ``argparse.py`` in the working folder shadowed the standard library's before the fix."""
    import subprocess

    run = _run(tmp_path / "run", {"name": "ds2"})
    (run / "argparse.py").write_text(f"open({str(tmp_path / 'RAN')!r}, 'w').write('ran')\nraise SystemExit(99)\n")
    p = subprocess.run([sys.executable, "-m", "speechperf", "tta", "."], cwd=run, capture_output=True, text=True,
                       timeout=300, env={k: v for k, v in __import__("os").environ.items() if k != "PYTHONPATH"})
    assert p.returncode == 0 and "copied" in p.stdout, p.stderr
    assert not (tmp_path / "RAN").exists()
