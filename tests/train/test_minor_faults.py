"""Small faults of issue 21: a signal during the final evaluation, a label that changed under
an existing run, an evaluation of a split that exists nowhere."""
import os
import signal

import pytest

from speechperf.cli import main
from speechperf.results.view import RunView
from speechperf.train import loop
from speechperf.train.request import TrainRequest
from speechperf.train.stop import Interrupted

TINY = ["threads=1", "max_epochs=1", "train.eval.final_splits=dev-clean,test-clean"]


def test_a_sigterm_during_the_final_evaluation_stops_it_and_the_same_command_evaluates_again(
        tiny_features, tmp_path, monkeypatch):
    run, real, calls = tmp_path / "run", loop._evaluate, []

    def signalled(model, t, split, beam, **kw):
        if beam == t.cfg.train.eval.final_beam and not calls:
            calls.append(split)
            os.kill(os.getpid(), signal.SIGTERM)  # arrives while the first final split is evaluated
        return real(model, t, split, beam, **kw)

    monkeypatch.setattr(loop, "_evaluate", signalled)
    with pytest.raises(Interrupted, match="during the final evaluation") as e:
        loop.train(TrainRequest("tiny", tiny_features, run, TINY, quiet=True))
    assert e.value.exit_code == 143
    with RunView.open(run) as r:
        assert not r.finished and r.rows.row()["status"].startswith("failed: interrupted (SIGTERM)")
    monkeypatch.setattr(loop, "_evaluate", real)
    summary = loop.train(TrainRequest("tiny", tiny_features, run, TINY, quiet=True))  # the same command: evaluates again
    assert summary["status"] == "success"
    with RunView.open(run) as r:
        assert sorted(e["split"] for e in r.rows.evals(final=True)) == ["dev-clean", "test-clean"]


def test_a_changed_label_on_an_existing_run_is_refused(tiny_features, tmp_path, capsys):
    run = tmp_path / "run"
    argv = ["train", "--preset", "tiny", "--data", str(tiny_features), "--out", str(run), *TINY]
    assert main([*argv, "--label", "first"]) == 0
    assert main([*argv, "--label", "second"]) == 2
    assert "labelled 'first', not 'second'" in capsys.readouterr().err
    assert main([*argv, "--label", "first"]) == 0 and main(argv) == 0  # the same label, or none: reported


def test_eval_of_a_split_that_exists_nowhere_names_what_exists(tiny_features, tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["train", "--preset", "tiny", "--data", str(tiny_features), "--out", str(run), *TINY]) == 0
    capsys.readouterr()
    assert main(["eval", str(run), "--split", "nosuch"]) == 2
    err = capsys.readouterr().err
    assert "has no split 'nosuch' (prepared: dev-clean" in err and "has none to prepare" in err
    assert "--splits nosuch" not in err  # no command that cannot work


@pytest.mark.parametrize("error", [
    RuntimeError("[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer [127.0.0.1]:3321"),
    __import__("torch").distributed.DistBackendError("NCCL communicator was aborted on rank 1"),
])
def test_a_lost_peer_is_a_named_run_failure_not_a_traceback(error, tmp_path, monkeypatch):
    from speechperf.train.faults import PeerLost, as_fault

    monkeypatch.setenv("RANK", "0")
    fault = as_fault(error, tmp_path)
    assert isinstance(fault, PeerLost) and fault.exit_code == 1
    assert str(fault).startswith("rank 0 lost its process group") and "torchrun --max-restarts" in str(fault)
    assert as_fault(RuntimeError("shape mismatch"), tmp_path) is None  # other errors stay themselves


@pytest.mark.parametrize("existing", [False, True])
def test_a_max_duration_below_the_longest_utterance_is_refused_exactly_and_leaves_no_file(
        tiny_features, tmp_path, capsys, existing):
    """Refused after the run folder's lock was taken (the plan cuts batches): neither the lock
    file nor the folder this command made stays behind, and the message's numbers are exact."""
    run = tmp_path / "run"
    if existing:
        run.mkdir()  # the user's empty folder stays, empty
    argv = ["train", "--preset", "tiny", "--data", str(tiny_features), "--out", str(run), *TINY,
            "loader.max_duration=1"]
    assert main(argv) == 2
    assert (list(run.iterdir()) == []) if existing else not run.exists()  # no .speechperf.lock
    err = capsys.readouterr().err
    m = __import__("re").search(r"utterance \S+ \(([\d.]+) s\) costs ([\d.]+) s, more than loader.max_duration=1: "
                                r"raise max_duration", err)
    assert m, err
    assert float(m.group(2)) > 1 and m.group(1) != "1.0" and m.group(2) != "1.0", err


@pytest.mark.parametrize("value", ["150", "100.5", "-1"])
def test_train_target_must_be_an_error_rate_as_tta_targets_are(value):
    from speechperf.config import load_preset
    from speechperf.errors import ConfigError
    from speechperf.scoring.targets import TargetError, parse_targets

    with pytest.raises(ConfigError, match=r"train.stop.target=\S+ must be an error rate in \(0, 100\] % \(or 0: never"):
        load_preset("tiny", [f"train.stop.target={value}"])
    with pytest.raises(TargetError):  # the same rule as tta --targets
        parse_targets(value)
    assert load_preset("tiny", ["train.stop.target=100"]).train.stop.target == 100
    assert load_preset("tiny", ["train.stop.target=0"]).train.stop.target == 0
