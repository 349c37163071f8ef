"""A model written outside the package (tests/models/external_model.py, named MODULE:NAME with
its folder on PYTHONPATH), through the real CLI as a buyer runs it: refused before a run folder
exists where it falls short; trained on the tiny corpus to its target with MFU; shown by its
name in ``tta`` and ``report`` (from the workload run.json recorded: neither imports it); evaluated
later (``eval --trust-model external_model``: a folder's module is imported only where the command
line names it) and timed by ``bench zoo``, each a new process."""
import json
import os
from functools import partial
from pathlib import Path

import pytest

from tests.conftest import cli

MODELS_DIR = Path(__file__).resolve().parents[1] / "models"
EXT = "external_model:ext_conv"
TARGET = "90"  # CER: the model crosses it at epoch 3 of 8 on the tiny corpus (84.6)


def outside_env() -> dict:
    """This environment with the external model's folder on the Python path."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(MODELS_DIR), os.environ.get("PYTHONPATH")]))}


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_model_outside_the_package_trains_to_its_target_and_shows_by_its_name(tiny_features, tmp_path):
    run, env = tmp_path / "run", outside_env()
    train = ["train", "--preset", "tiny", "--data", tiny_features, "--out", run, "threads=1", "train.eval.decoder=greedy"]
    p = cli(*train, "model.name=external_model:ext_plain", env=env)
    assert p.returncode == 2 and not run.exists(), p.stderr
    assert p.stderr.strip().count("\n") == 0 and "model 'external_model:ext_plain' does not meet" in p.stderr

    ok = partial(cli, timeout=600, check=True, env=env)
    out = ok(*train, f"model.name={EXT}", "max_epochs=8", f"target={TARGET}", "target_epochs=1", "--json").stdout
    summary = json.loads(out)
    summary = summary[0] if isinstance(summary, list) else summary
    assert summary["status"] == "success" and summary["epochs"] < 8 and summary["last_cer"] <= float(TARGET)
    assert 0 < summary["mfu_pct"] <= 100 and summary["model_flops_steps"] == summary["iterations"]
    assert json.loads((run / "config.json").read_text())["model"]["name"] == EXT

    row = json.loads(ok("tta", run, "--targets", TARGET, "--epochs", "1", "--json").stdout)["runs"][0]
    assert row["workload"].startswith("ext_conv, ") and row["epochs to target"] == summary["epochs"]
    assert row["MFU %"] == summary["mfu_pct"]
    ok("report", run, "--out", tmp_path / "report")
    assert "ext_conv, " in (tmp_path / "report" / "index.html").read_text(encoding="utf-8")

    p = cli("eval", run, "--decoder", "greedy", env=env)  # the folder names the module: not imported unasked
    assert p.returncode == 2 and "--trust-model external_model" in p.stderr, p.stderr
    (dev,) = json.loads(ok("eval", run, "--decoder", "greedy", "--trust-model", "external_model", "--json").stdout)
    assert dev["cer"] == pytest.approx(summary["last_cer"])  # the checkpoint's weights, in the same model again

    zoo = json.loads(ok("bench", "zoo", "--models", EXT, "--batch", "2", "--iters", "1", "--json").stdout)
    assert [(r["model"], r["status"]) for r in zoo] == [("ext_conv", "ok")] and zoo[0]["tflops"] > 0
