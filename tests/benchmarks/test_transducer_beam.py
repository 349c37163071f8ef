"""benchmarks/bench_transducer_beam.py: a real tiny transducer run's evaluation through the suite's
runner, the batched and the one-at-a-time beam search giving the same texts; a run that is not an
RNN-T, or none, refused by name."""
from tests.conftest import cli, run_benchmark
from tests.train.test_every_model import SIZES, _args


def test_a_run_prints_each_arm_and_the_same_texts(tiny_features, tmp_path, capsys):
    run = tmp_path / "run"
    p = cli(*_args("transducer", tiny_features, run), *SIZES["transducer"], "max_epochs=1")
    assert p.returncode == 0, p.stderr
    assert run_benchmark("transducer_beam", "--no-ledger", "--run", run, "--rounds", "1", "--beam", "3") == 0
    out = capsys.readouterr().out
    assert "the texts of both beam arms are the same" in out
    for arm in ("one-at-a-time", "batched", "greedy"):
        assert f"\n{arm} " in out
    assert "transducer_beam: batched / one at a time (median evaluation seconds) = " in out


def test_no_run_or_a_ctc_run_is_refused_by_name(tiny_run, capsys):
    assert run_benchmark("transducer_beam", "--no-ledger") == 2
    assert "transducer_beam needs --run RUN" in capsys.readouterr().err
    assert run_benchmark("transducer_beam", "--no-ledger", "--run", tiny_run) == 2
    assert "is not an RNN-T transducer" in capsys.readouterr().err
