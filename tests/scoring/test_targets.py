"""TTA targets: the named sets (paper; AlgoPerf's, which depend on the run's model) and the
protocol each belongs to (AlgoPerf's refused for speechperf's runs, saying why), explicit
error rates, and the refusal of anything that is no error rate, naming it as written."""
import json

import pytest

from speechperf.cli import main
from speechperf.config import ConfigError, load_preset
from speechperf.scoring.targets import ALGOPERF_WER, PAPER, TargetError, Targets, parse_targets, run_protocol
from speechperf.studies.tta import tta_table
from speechperf.results.run import Run

ENV = {"cpu_model": "Test CPU", "cpu_cores_logical": 2, "gpus": []}


def test_named_sets_and_numbers():
    assert parse_targets("paper") == Targets("paper") and parse_targets("algoperf") == Targets("algoperf")
    assert Targets("paper").of("cer", "conformer") == (10.0, 8.0, 7.0) == PAPER["cer"]
    assert Targets("paper").of("wer", "ds2") == (22.0, 20.2, 19.2)
    assert Targets("algoperf").of("wer", "conformer") == (8.5884,) and Targets("algoperf").of("wer", "ds2") == (11.9936,)
    assert Targets("algoperf").of("cer", "ds2") == () and Targets("algoperf").of("wer", "dnn") == ()
    explicit = parse_targets("10, 8.5", metric="wer")
    assert (explicit.values, explicit.of("wer", "ds2"), explicit.of("cer", "ds2"), str(explicit)) == (
        (10.0, 8.5), (10.0, 8.5), (), "10,8.5")
    assert parse_targets([100, 0.5]).values == (100.0, 0.5)


@pytest.mark.parametrize("bad,named", [("-5,1e9,nan", "-5, 1e9, nan"), ("0", "0"), ("inf", "inf"), ("100.01", "100.01"),
                                       ("10,-1", "-1")])
def test_not_an_error_rate_is_refused_as_written(bad, named):
    with pytest.raises(TargetError, match=f"TTA target {named}: not an error rate in \\(0, 100\\]"):
        parse_targets(bad)


def test_the_cli_refuses_bad_targets_naming_them(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        main(["tta", str(tmp_path), "--targets=-5,1e9,nan"])
    assert e.value.code == 2 and "TTA target -5, 1e9, nan: not an error rate" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        main(["report", str(tmp_path), "--out", str(tmp_path / "r"), "--targets", "papers"])
    assert e.value.code == 2 and "'papers': neither a target set (paper, algoperf) nor numbers" in capsys.readouterr().err
    with pytest.raises(TargetError, match="TTA target nan"):
        tta_table([tmp_path], targets=[float("nan")])  # the library refuses too, before opening anything


def _run(root, name: str, model: dict, wers: list[float], protocol: str | None = None):
    """A run of ``model`` whose per-epoch validation WER (CER: half) is ``wers``, one epoch a minute;
    ``protocol``: the train.protocol its config.json records (None: a run recorded before the field)."""
    train = {"seed": 1, "eval_split": "dev-clean", **({"protocol": protocol} if protocol else {})}
    config = {"preset": name, "model": model, "train": train}
    with Run.create(root / name, kind="train", config=config, env=ENV, label=name) as run:
        run.rows.insert("evals", [{"run_id": run.run_id, "epoch": e, "split": "dev-clean", "decoder": "greedy", "beam": 1,
                              "clock_s": 60.0 * e, "eval_s": 1.0, "loss": 1.0, "wer": w, "cer": w / 2,
                              "cer_paper": w / 2, "n_utts": 5, "final": 0} for e, w in enumerate(wers, 1)])
    return root / name


DS2 = {"name": "ds2", "conv_channels": 8, "lstm_layers": 1, "lstm_hidden": 8}


def test_algoperf_targets_are_refused_for_speechperf_runs(tmp_path, capsys):
    """speechperf has no AlgoPerf-faithful workload: AlgoPerf's targets beside a DS2 run (another
    model than AlgoPerf's DeepSpeech) or a Conformer of AlgoPerf's sizes would read as AlgoPerf's result."""
    ds2 = _run(tmp_path, "ds2", DS2, [30, 12, 11, 11, 11], protocol="speechperf")
    assert main(["tta", str(ds2), "--targets", "algoperf", "--metric", "wer"]) == 2
    err = capsys.readouterr().err
    assert "--targets algoperf: run 'ds2' is not AlgoPerf's workload" in err
    assert "train.protocol='speechperf'" in err and "AlgoPerf's DeepSpeech is another model" in err
    assert "speechperf has no AlgoPerf-faithful workload yet" in err
    sizes = _run(tmp_path, "sizes", load_preset("conformer-algoperf-sizes").to_dict()["model"], [30, 9, 8, 8])
    assert main(["tta", str(sizes), "--targets", "algoperf", "--metric", "wer", "--json"]) == 2  # recorded before the field
    assert "SentencePiece 1024" in capsys.readouterr().err
    assert main(["report", str(ds2), "--out", str(tmp_path / "r"), "--targets", "algoperf", "--metric", "wer"]) == 2
    assert "run 'ds2' is not AlgoPerf's workload" in capsys.readouterr().err and not (tmp_path / "r").exists()
    assert main(["tta", str(ds2), str(sizes), "--targets", "paper", "--json"]) == 0  # the paper's thresholds apply
    assert {r["run"] for r in json.loads(capsys.readouterr().out)["runs"]} == {"ds2", "sizes"}
    assert main(["tta", str(ds2), "--targets", "15", "--metric", "wer", "--json"]) == 0
    assert [(r["target"], r["minutes"]) for r in json.loads(capsys.readouterr().out)["runs"]] == [(15.0, 3.0)]


def test_no_run_can_claim_algoperfs_protocol():
    assert load_preset("tiny").train.protocol == "speechperf" == run_protocol(load_preset("tiny").to_dict())
    with pytest.raises(ConfigError, match="train.protocol='algoperf': speechperf implements only speechperf"):
        load_preset("tiny", ["train.protocol=algoperf"])


def test_algoperf_targets_follow_the_model_of_a_run_of_algoperfs_protocol(tmp_path, capsys):
    """The check reads the run's recorded protocol: a run recording AlgoPerf's (none can be trained
    today; written here by hand) gets AlgoPerf's target of its model, and the paper's are refused."""
    ds2 = _run(tmp_path, "ds2", DS2, [30, 12, 11, 11, 11], protocol="algoperf")
    conformer = _run(tmp_path, "conf", {"name": "conformer"}, [30, 12, 11, 8, 8, 8], protocol="algoperf")
    rows = tta_table([ds2, conformer], metric="wer", targets="algoperf")
    assert [(r["run"], r["target"], r["minutes"], r["relative"]) for r in rows] == [
        ("ds2", ALGOPERF_WER["ds2"], 4.0, 100.0), ("conf", ALGOPERF_WER["conformer"], 5.0, 100.0)]
    assert main(["tta", str(ds2), "--targets", "algoperf"]) == 2  # CER: AlgoPerf has none
    assert "AlgoPerf's targets are validation WER; give --metric wer" in capsys.readouterr().err
    dnn = _run(tmp_path, "dnn", {"name": "dnn"}, [30, 20, 10], protocol="algoperf")
    assert main(["tta", str(dnn), "--targets", "algoperf", "--metric", "wer", "--json"]) == 2
    assert "--targets algoperf has no target for model 'dnn'" in capsys.readouterr().err
    assert main(["tta", str(ds2), "--targets", "paper"]) == 2
    assert "--targets paper: its targets are for runs of protocol 'speechperf'" in capsys.readouterr().err
    assert main(["tta", str(ds2), "--targets", "15", "--metric", "wer", "--json"]) == 0
    assert [(r["target"], r["minutes"]) for r in json.loads(capsys.readouterr().out)["runs"]] == [(15.0, 3.0)]


def test_the_report_takes_a_target_set_or_numbers(tmp_path):
    import csv

    from speechperf.studies.report.html import build_report

    ds2 = _run(tmp_path, "ds2", DS2, [30, 12, 11, 11], protocol="algoperf")
    conformer = _run(tmp_path, "conf", {"name": "conformer", "d_model": 16, "layers": 1, "heads": 2}, [30, 9, 8, 8],
                     protocol="algoperf")

    def targets(out) -> set:
        return {(r["run"], r["metric"], float(r["target %"])) for f in sorted(out.glob("tta*.csv"))
                for r in csv.DictReader(open(f, newline=""))}

    build_report([ds2, conformer], tmp_path / "a", targets="algoperf")
    assert targets(tmp_path / "a") == {("ds2", "WER", ALGOPERF_WER["ds2"]), ("conf", "WER", ALGOPERF_WER["conformer"])}
    build_report([ds2], tmp_path / "b", targets="15", metric="wer")
    assert targets(tmp_path / "b") == {("ds2", "WER", 15.0)}
    assert main(["report", str(ds2), "--out", str(tmp_path / "c"), "--targets", "9", "--metric", "cer"]) == 0
    assert targets(tmp_path / "c") == {("ds2", "CER", 9.0)}
