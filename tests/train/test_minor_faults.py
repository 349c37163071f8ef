"""Small faults of issue 21: a signal during the final evaluation, a label that changed under
an existing run, an evaluation of a split that exists nowhere."""
import os
import signal

import pytest

from speechperf.cli import main
from speechperf.results.run import Run
from speechperf.train import loop
from speechperf.train.stop import Interrupted

TINY = ["threads=1", "max_epochs=1", "train.final_splits=dev-clean,test-clean"]


def test_a_sigterm_during_the_final_evaluation_stops_it_and_the_same_command_evaluates_again(
        tiny_features, tmp_path, monkeypatch):
    run, real, calls = tmp_path / "run", loop._evaluate, []

    def signalled(model, data, split, cfg, device, beam, **kw):
        if beam == cfg.train.final_beam and not calls:
            calls.append(split)
            os.kill(os.getpid(), signal.SIGTERM)  # arrives while the first final split is evaluated
        return real(model, data, split, cfg, device, beam, **kw)

    monkeypatch.setattr(loop, "_evaluate", signalled)
    with pytest.raises(Interrupted, match="during the final evaluation") as e:
        loop.train("tiny", tiny_features, run, TINY, quiet=True)
    assert e.value.exit_code == 143
    with Run.open(run) as r:
        assert not r.finished and r.row()["status"].startswith("failed: interrupted (SIGTERM)")
    monkeypatch.setattr(loop, "_evaluate", real)
    summary = loop.train("tiny", tiny_features, run, TINY, quiet=True)  # the same command: evaluates again
    assert summary["status"] == "success"
    with Run.open(run) as r:
        assert sorted(e["split"] for e in r.evals(final=True)) == ["dev-clean", "test-clean"]


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
