"""The run folder's admission (train/admission.py): one call decides fresh, restart, resume or
finished and holds the folder's lock; what it refuses leaves no file behind."""
import errno
import json

import pytest

from speechperf.config import ConfigError, load_preset
from speechperf.data.batching import Batching
from speechperf.errors import MachineFault
from speechperf.results import checkpoint
from speechperf.train.admission import admit, config_diff, follow
from speechperf.train.recorder import Recorder
from speechperf.results.lock import LOCK_FILE
from speechperf.results.progress import Progress
from speechperf.train.loop import train
from speechperf.train.request import TrainRequest
from speechperf.results.layout import is_run
from speechperf.results.run import Run

ENV = {"hostname": "h", "cpu_model": "Test CPU", "world_size": 1}


def _launch_ok(algo, world):
    assert world == 1


def _admit(request, **over):
    cfg = request.configuration()
    return admit(request, cfg, Batching(cfg.loader, cfg.train.seed), over.get("check_launch", _launch_ok)), cfg


def _begin(adm, cfg, data, label=None):
    """The run ``adm`` begins as it planned (what train/trainer.py's start asks of rank 0's admission)."""
    return adm.begin(config=cfg.to_dict(), env=ENV, progress=Progress(), data=data, label=label, shared_db=None)


def test_a_new_run_is_fresh_and_holds_the_lock_until_released(tiny_features, tmp_path):
    out = tmp_path / "run"
    adm, cfg = _admit(TrainRequest("tiny", tiny_features, out))
    assert adm.decision == ("fresh", str(tiny_features), None)
    assert adm.lock is not None and (out / LOCK_FILE).is_file()  # another process is refused: tests/results/test_lock.py
    run = _begin(adm, cfg, tiny_features)
    assert isinstance(run, Run) and run.folder == out and is_run(out)  # begun under the lock admit holds
    run.close()
    adm.release()
    again, _ = _admit(TrainRequest("tiny", tiny_features, out))
    assert again.decision == ("restart", str(tiny_features), None)  # a run without a checkpoint yet
    again.release()


def test_every_rank_reads_the_checkpoint_and_names_the_run_through_its_admission(tiny_features, tmp_path):
    out = tmp_path / "run"
    adm, cfg = _admit(TrainRequest("tiny", tiny_features, out))
    run = _begin(adm, cfg, tiny_features)
    checkpoint.save(run, Progress(iteration=3), {"model": {"w": [1.0, 2.0]}})  # the run's own writer, waited for
    run.close()
    adm.release()
    rank0, _ = _admit(TrainRequest("tiny", tiny_features, out))
    other = follow(TrainRequest("tiny", tiny_features, out), rank0.decision)  # what the loop gives ranks > 0
    try:
        assert other.decision == rank0.decision == ("resume", str(tiny_features), None) and other.lock is None
        assert other.checkpoint()[checkpoint.PROGRESS] == rank0.checkpoint()[checkpoint.PROGRESS]
        assert rank0.checkpoint()[checkpoint.PROGRESS]["iteration"] == 3
        other.release()  # holds no lock: nothing to release, the folder stays
        assert is_run(out) and (out / LOCK_FILE).is_file()
        assert Recorder(Progress(), other).out == out  # the other ranks' messages name the run folder
        fault = other.fault(OSError(errno.EIO, "Input/output error", str(out / "x")))
        assert isinstance(fault, MachineFault) and f"the run in {out} stopped" in str(fault)
    finally:
        rank0.release()


def test_a_read_only_out_is_named_by_admit(tiny_features, tmp_path, monkeypatch):
    out = tmp_path / "ro" / "run"

    def read_only(self, *a, **kw):
        raise OSError(errno.EROFS, "Read-only file system", str(self))
    monkeypatch.setattr(type(out), "mkdir", read_only)  # the folder admit makes for a new run
    with pytest.raises(MachineFault, match="Read-only file system") as e:
        _admit(TrainRequest("tiny", tiny_features, out))
    assert f"the run in {out} stopped" in str(e.value) and e.value.exit_code == 1


def test_what_is_refused_leaves_no_folder(tiny_features, tmp_path):
    out = tmp_path / "run"
    adm, _ = _admit(TrainRequest("tiny", None, out))
    assert adm.plan is None and "--data FEATS" in adm.error and not out.exists()
    adm, _ = _admit(TrainRequest("tiny", tiny_features, out, resume="yes"))
    assert adm.error == f"--resume yes but {out} holds no run" and not out.exists()

    def refused(algo, world):
        raise ConfigError("single takes one process")
    adm, _ = _admit(TrainRequest("tiny", tiny_features, out), check_launch=refused)
    assert adm.error == "single takes one process" and not out.exists()


def test_another_configuration_or_label_or_a_finished_run(tiny_features, tmp_path):
    out = tmp_path / "run"
    adm, cfg = _admit(TrainRequest("tiny", tiny_features, out, label="mine"))
    run = _begin(adm, cfg, tiny_features, label="mine")
    adm.release()
    other, _ = _admit(TrainRequest("tiny", tiny_features, out, ["train.optim.lr=0.5"]))
    assert "holds a run of another configuration (train.optim.lr:" in other.error and other.lock is None
    named, _ = _admit(TrainRequest("tiny", tiny_features, out, label="theirs"))
    assert "holds a run labelled 'mine', not 'theirs'" in named.error
    refused, _ = _admit(TrainRequest("tiny", tiny_features, out, resume="no"))
    assert "already holds a run" in refused.error
    run.write_summary({"status": "success"})
    run.close()
    done, _ = _admit(TrainRequest("tiny", tiny_features, out))
    assert done.decision == ("finished", None, None) and done.lock is None and done.summary()["status"] == "success"
    # --resume RUN: that run's recorded configuration, the folder as --out (whatever --out says), continued as yes
    request = TrainRequest(out=tmp_path / "other", resume=out)
    assert (request.out, request.mode, request.configuration().to_dict()) == (out, "yes", load_preset("tiny", []).to_dict())
    with pytest.raises(ConfigError, match="overrides are not allowed with --resume RUN"):
        TrainRequest(resume=out, overrides=["train.optim.lr=0.5"]).configuration()
    assert json.loads((out / "run.json").read_text())["label"] == "mine"


def test_config_diff_names_each_field():
    assert config_diff({"train": {"lr": 1, "s": [1]}}, {"train": {"lr": 2, "s": (1,)}}) == ["train.lr: 1 there, 2 now"]


def test_a_seed_request_adds_its_seed_last_and_its_label_suffix(tmp_path):
    seed = TrainRequest("tiny", overrides=["a=1"], label="x").for_seed(3, tmp_path / "seed-3", ("train.system.threads=2",))
    assert seed.overrides == ("a=1", "train.system.threads=2", "train.seed=3") and seed.label_suffix == " seed 3"
    assert seed.given_label() == "x seed 3" and seed.out == tmp_path / "seed-3"
    assert is_run(seed.out) is False


def test_a_killed_checkpoints_temporary_is_removed_when_the_run_continues(tiny_features, tmp_path):
    """A SIGKILL inside an atomic write (a checkpoint's: gigabytes at scale) leaves its temporary in
    the run folder; the command that continues the run, holding the folder's lock, removes it."""
    run = tmp_path / "run"
    train(TrainRequest("tiny", tiny_features, run, ["max_epochs=1", "threads=1"], quiet=True))
    (run / "summary.json").unlink()  # unfinished: the same command continues it
    stale = run / ".checkpoint.pt.k1ll3d.tmp"
    stale.write_bytes(b"half a checkpoint")
    train(TrainRequest("tiny", tiny_features, run, ["max_epochs=1", "threads=1"], quiet=True))
    assert not stale.exists() and (run / "summary.json").is_file()
