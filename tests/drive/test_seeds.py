"""``train --seeds``: one run folder per seed, resumable as one command (drive/seeds.py)."""
import json
import os
import signal
import subprocess
import time

import pytest

from speechperf.cli import main
from speechperf.config import ConfigError
from speechperf.results import ResultsDB
from speechperf.results.checkpoint import CheckpointError, load as load_checkpoint
from speechperf.results.events import read_events
from speechperf.drive.seeds import parse_seeds, refuse_seed_override
from tests.conftest import cli, cli_argv

TINY = ["--preset", "tiny", "threads=1"]


def _rows(run, sql):
    info = json.loads((run / "run.json").read_text())
    with ResultsDB(run / "results.db", readonly=True) as db:
        return db.query(sql, [info["run_id"]])


LOSSES = "SELECT iteration, loss, batch_size FROM iterations WHERE run_id = ? ORDER BY iteration"


def test_seeds_make_one_run_folder_per_seed_with_that_seed(tiny_features, tmp_path):
    out = tmp_path / "out"
    p = cli("train", "--data", tiny_features, "--out", out, "--seeds", "2", "--json", *TINY, "max_epochs=1")
    assert p.returncode == 0, p.stderr
    summaries = json.loads(p.stdout)
    assert [s["seed"] for s in summaries] == [1, 2] and all(s["status"] == "success" for s in summaries)
    assert sorted(x.name for x in out.iterdir()) == ["seed-1", "seed-2"]
    for seed in (1, 2):
        run = out / f"seed-{seed}"
        assert json.loads((run / "config.json").read_text())["train"]["seed"] == seed
        assert json.loads((run / "run.json").read_text())["label"].endswith(f" seed {seed}")
        assert _rows(run, "SELECT seed FROM runs WHERE run_id = ?") == [{"seed": seed}]
    assert _rows(out / "seed-1", LOSSES) != _rows(out / "seed-2", LOSSES)  # another seed, another run

    # every evaluation carries its 95% interval over the split's utterances (scoring/bootstrap.py)
    evals = _rows(out / "seed-1", "SELECT final, cer, cer_lo, cer_hi, wer, wer_lo, wer_hi FROM evals WHERE run_id = ?")
    assert len(evals) == 1 + 4  # the epoch's and the final evaluation's four splits
    for e in evals:
        assert e["cer_lo"] <= e["cer"] <= e["cer_hi"] and e["wer_lo"] <= e["wer"] <= e["wer_hi"], e
    assert any(e["cer_lo"] < e["cer_hi"] for e in evals)
    # tta --json: the evaluations with their intervals, and the one where each target was declared
    p = cli("tta", out / "seed-1", out / "seed-2", "--json", "--targets", "99", "--epochs", "1")
    assert p.returncode == 0, p.stderr
    study = json.loads(p.stdout)
    assert [(e["run"].split()[-1], e["epoch"]) for e in study["evaluations"]] == [("1", 1), ("2", 1)]
    assert all(e["cer_lo"] <= e["cer"] <= e["cer_hi"] for e in study["evaluations"])
    for row, e in zip(study["runs"], study["evaluations"]):
        assert (row["error at TTA"], row["error 95% low"], row["error 95% high"]) == (e["cer"], e["cer_lo"], e["cer_hi"])
    assert [g["runs"] for g in study["groups"]] == [2]  # the seeds of one command form one group


def _stop_when_checkpointed(p, run, at_least):
    """SIGSTOP the seeds command as soon as ``run`` (seed 2's folder) has a checkpoint at
    iteration >= ``at_least``: stopped, it cannot finish before it is killed."""
    while p.poll() is None:
        try:
            if load_checkpoint(run)["progress"]["iteration"] >= at_least:
                os.kill(p.pid, signal.SIGSTOP)
                return True
        except CheckpointError:
            pass
        time.sleep(0.02)
    return False


def _files(run):
    return {name: ((run / name).read_bytes(), (run / name).stat().st_mtime_ns)
            for name in ("results.db", "summary.json", "checkpoint.pt", "events.log", "run.json")}


@pytest.mark.timeout(300)
def test_a_seeds_command_killed_in_seed_2_continues_it_and_keeps_seed_1(tiny_features, tmp_path):
    args = ["train", "--data", tiny_features, "--seeds", "2", "--json", *TINY, "max_epochs=8", "checkpoint_every=5"]
    out, ref = tmp_path / "out", tmp_path / "ref"
    # the uninterrupted seed 2, alongside (one thread each: bit-exact whatever the load)
    reference = subprocess.Popen(cli_argv("train", "--data", tiny_features, "--out", ref, "--json", *TINY,
                                       "max_epochs=8", "checkpoint_every=5", "train.seed=2"),
                                 stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    p = subprocess.Popen(cli_argv(*args[:1], "--out", out, *args[1:]), stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, text=True)
    try:
        # past seed 2's first epoch, so that the part before the kill is trained in the process
        # that trained seed 1 before it
        assert _stop_when_checkpointed(p, out / "seed-2", 15), f"seed 2 finished first: {p.stderr.read()}"
        os.kill(p.pid, signal.SIGKILL)
    finally:
        p.kill()
        p.wait()
    assert not (out / "seed-2" / "summary.json").exists()
    seed1 = _files(out / "seed-1")

    again = cli(*args[:1], "--out", out, *args[1:])
    assert again.returncode == 0, again.stderr
    assert [(s["seed"], s["status"]) for s in json.loads(again.stdout)] == [(1, "success"), (2, "success")]
    assert _files(out / "seed-1") == seed1  # a finished seed is only read again
    keys = [e["key"] for e in read_events(out / "seed-2" / "events.log")]
    assert keys.count("resume") == 1 and keys.count("run_start") == 1
    assert reference.wait(timeout=300) == 0, reference.stderr.read()
    assert _rows(out / "seed-2", LOSSES) == _rows(ref, LOSSES)  # every loss, bit for bit
    sql = "SELECT epoch, split, final, loss, wer, cer FROM evals WHERE run_id = ? ORDER BY final, split, epoch"
    assert _rows(out / "seed-2", sql) == _rows(ref, sql)


@pytest.mark.parametrize("text,seeds", [("3", (1, 2, 3)), ("3,7", (3, 7)), ("6-10", (6, 7, 8, 9, 10)),
                                        ("1,4-5", (1, 4, 5)), (" 2 ", (1, 2))])
def test_seed_lists(text, seeds):
    assert parse_seeds(text) == seeds


@pytest.mark.parametrize("text,said", [("0", "at least one seed"), ("5-3", "runs backwards"),
                                       ("1,2,1", "seed 1 named twice"), ("a", "give a count N"),
                                       (",", "no seed named")])
def test_bad_seed_lists_are_refused(text, said):
    with pytest.raises(ConfigError, match=said):
        parse_seeds(text)


@pytest.mark.parametrize("override", ["train.seed=3", "seed=3"])
def test_an_explicit_seed_with_seeds_is_refused(override, tiny_features, tmp_path, capsys):
    with pytest.raises(ConfigError, match="--seeds sets train.seed of each run itself"):
        refuse_seed_override(["lr=0.01", override])
    out = tmp_path / "out"
    code = main(["train", "--data", str(tiny_features), "--out", str(out), "--seeds", "2", *TINY, override])
    err = capsys.readouterr().err
    assert code == 2 and f"{override} with --seeds" in err and not out.exists()


def test_a_bad_seed_list_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as e:
        main(["train", "--out", "x", "--seeds", "5-3"])
    assert e.value.code == 2 and "runs backwards" in capsys.readouterr().err


def test_a_failing_seed_stops_the_command_naming_it(tiny_features, tmp_path, monkeypatch, capsys):
    """A seed that ends diverged stops the seeds after it: exit 1, the seed and its folder named."""
    from speechperf.studies.study import run_check
    from speechperf.train import loop

    calls = []

    def fake_train(request):
        out = request.out
        calls.append((out.name, request.overrides[-1], request.label_suffix))
        assert request.check is run_check  # handed down by cmd_train: each seed's summary holds its check
        return {"run": str(out), "status": "diverged: 5 bad steps in a row" if out.name == "seed-2" else "success"}

    monkeypatch.setattr(loop, "train", fake_train)
    out = tmp_path / "out"
    code = main(["train", "--data", str(tiny_features), "--out", str(out), "--seeds", "3", "--json", *TINY])
    err = capsys.readouterr().err
    assert code == 1 and f"seed 2 ended diverged: 5 bad steps in a row ({out / 'seed-2'})" in err
    assert "seeds 3 not trained" in err
    assert calls == [("seed-1", "train.seed=1", " seed 1"), ("seed-2", "train.seed=2", " seed 2")]


def test_seeds_with_a_run_folder_to_resume_is_refused(tmp_path, capsys):
    code = main(["train", "--out", str(tmp_path / "out"), "--seeds", "2", "--resume", str(tmp_path / "old")])
    assert code == 2 and "--resume takes auto, yes, no there" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_seeds_with_a_label_continue_under_the_same_command(tiny_features, tmp_path):
    """A given --label gets " seed S" per seed; the same command again is the same label."""
    from speechperf.train.request import TrainRequest
    from speechperf.drive.seeds import train_seeds

    request = TrainRequest(preset="tiny", data=tiny_features, out=tmp_path / "o",
                           overrides=["threads=1", "max_epochs=1"], quiet=True, label="mine")
    first = train_seeds([1, 2], request)
    again = train_seeds([1, 2], request)
    assert [r["status"] for r in first] == [r["status"] for r in again] == ["success", "success"]
