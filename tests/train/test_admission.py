"""The run folder's admission (train/admission.py): one call decides fresh, restart, resume or
finished and holds the folder's lock; what it refuses leaves no file behind."""
import json

import pytest

from speechperf.config import ConfigError, load_preset
from speechperf.data.batching import Batching
from speechperf.train.admission import admit, config_diff
from speechperf.results.lock import LOCK_FILE
from speechperf.results.progress import Progress
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
    other, _ = _admit(TrainRequest("tiny", tiny_features, out, ["train.lr=0.5"]))
    assert "holds a run of another configuration (train.lr:" in other.error and other.lock is None
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
        TrainRequest(resume=out, overrides=["train.lr=0.5"]).configuration()
    assert json.loads((out / "run.json").read_text())["label"] == "mine"


def test_config_diff_names_each_field():
    assert config_diff({"train": {"lr": 1, "s": [1]}}, {"train": {"lr": 2, "s": (1,)}}) == ["train.lr: 1 there, 2 now"]


def test_a_seed_request_adds_its_seed_last_and_its_label_suffix(tmp_path):
    seed = TrainRequest("tiny", overrides=["a=1"], label="x").for_seed(3, tmp_path / "seed-3", ("train.threads=2",))
    assert seed.overrides == ("a=1", "train.threads=2", "train.seed=3") and seed.label_suffix == " seed 3"
    assert seed.given_label() == "x seed 3" and seed.out == tmp_path / "seed-3"
    assert is_run(seed.out) is False
