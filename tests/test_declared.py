"""Metrics as data: each metric declared once (speechperf/metric.py), every consumer reading the
declarations; a run folder and a checkpoint of the release before them still read as before."""
import csv
import json
import sqlite3
from types import SimpleNamespace

import pytest

from speechperf.errors import SpeechperfError
from speechperf.scoring.bootstrap import error_intervals
from speechperf.scoring.error_rates import utterance_errors
from speechperf import metric
from speechperf.metric import METRICS, Metric, MetricError
from speechperf.results.run import Run


def test_the_declarations():
    assert list(METRICS) == ["cer", "wer", "cer_paper", "ser"]
    assert metric.targets() == ("cer", "wer", "ser")
    assert metric.columns() == ("cer", "cer_lo", "cer_hi", "wer", "wer_lo", "wer_hi", "cer_paper",
                                "ser", "ser_lo", "ser_hi")
    assert metric.metric("wer").header == "WER %"
    with pytest.raises(MetricError, match="unknown metric 'xer'; declared: cer, wer, cer_paper, ser"):
        metric.metric("xer")
    with pytest.raises(ValueError, match="metric 'cer' registered twice"):
        metric.declare(Metric("cer", "CER", "again"))
    with pytest.raises(MetricError, match="a TTA target must be of a lower-is-better metric"):
        Metric("accuracy", "ACC", "right words / words", lower_is_better=False, target=True)


def test_a_value_prints_with_its_interval_where_the_row_holds_one():
    cer = metric.metric("cer")
    assert cer.text({"cer": 9.364, "cer_lo": 8.1, "cer_hi": 10.7}) == "9.36 [8.10, 10.70]"
    assert cer.text({"cer": 9.364, "cer_lo": None, "cer_hi": None}) == "9.36"  # a row before the intervals
    assert cer.text({"wer": 3.0}) is None  # not measured: no text, never 0


@pytest.fixture
def xer(monkeypatch):
    """A metric declared in one line (for this test only): WER's counts under another name."""
    import speechperf.studies.curve  # noqa: F401  modules whose constants read the declarations at import
    # take them before it (else a later test in this process would see xer in their constants)
    m = Metric("xer", "XER", "a test metric", target=True, counts=("word_edits", "ref_words"))
    monkeypatch.setitem(METRICS, "xer", m)
    return m


def test_one_declaration_reaches_the_consumers(xer, tmp_path):
    from speechperf.cli import build_parser
    from speechperf.train import recorder

    refs, hyps = ["a b c d", "e f"], ["a x c d", "e f"]
    measured = error_intervals(utterance_errors(refs, hyps))
    assert measured["xer"] == measured["wer"] == 100 * 1 / 6 and measured["xer_lo"] == measured["wer_lo"]
    line = recorder._rates({**measured, "cer_paper": 5.0})
    assert line.endswith(f"CER paper 5.00 SER 50.00 [0.00, 100.00] XER {measured['xer']:.2f} "
                         f"[{measured['xer_lo']:.2f}, {measured['xer_hi']:.2f}]")
    assert metric.entry(60.0, measured)["xer"] == measured["xer"]  # the stop rule's history
    parser = build_parser()
    assert parser.parse_args(["tta", "RUN", "--metric", "xer"]).metric == "xer"  # --metric's choices


def test_a_history_without_a_later_metric_summarizes_it_as_not_measured():
    from speechperf.results.progress import Progress
    from speechperf.train.recorder import _summary

    evals = [{"clock_s": 60.0, "wer": 30.0, "cer": 12.0}, {"clock_s": 120.0, "wer": 25.0, "cer": 9.0}]  # no SER
    prog = Progress.from_dict({"epoch": 3, "evals": evals})
    summary = _summary("r", "RUN", "success", prog, 120.0)
    assert (summary["epochs"], summary["last_cer"], summary["last_wer"], summary["last_ser"]) == (2, 9.0, 25.0, None)


# The evals table of the release before the declarations (commit ed215bc), as its run folders hold it.
PREVIOUS_EVALS = """
CREATE TABLE evals (
    run_id TEXT, epoch INTEGER, split TEXT, decoder TEXT, beam INTEGER, clock_s REAL, eval_s REAL,
    loss REAL, wer REAL, cer REAL, cer_paper REAL, n_utts INTEGER, final INTEGER DEFAULT 0,
    cer_lo REAL, cer_hi REAL, wer_lo REAL, wer_hi REAL,
    PRIMARY KEY (run_id, epoch, split, decoder, beam, final)
);
"""
PREVIOUS_BEAM_SWEEP = """
CREATE TABLE beam_sweep (
    run_id TEXT, split TEXT, decoder TEXT, beam INTEGER,
    eval_s REAL, wer REAL, cer REAL, cer_paper REAL, n_utts INTEGER, device TEXT,
    PRIMARY KEY (run_id, split, decoder, beam)
);
"""
CERS = [30.0, 12.0, 9.0, 9.0, 8.0]


def _previous_release_run(root):
    config = {"model": {"name": "ds2", "conv_channels": 8, "lstm_layers": 1, "lstm_hidden": 8},
              "train": {"seed": 1, "eval_split": "dev-clean"}}
    with Run.create(root / "old", kind="train", config=config, env={"cpu_model": "Test CPU"}, label="old") as run:
        run.rows.add_iteration({"iteration": 1, "epoch": 1, "clock_s": 1.0, "loss": 5.0, "batch_size": 2, "frames": 100,
                           "audio_s": 2.0, "step_s": 1.0, "utts_per_s": 2.0, "audio_s_per_s": 2.0})
        run.rows.set_status("success")
        run.write_summary({"status": "success", "init_s": 1.0, "last_wer": 16.0, "last_cer": 8.0})
        run_id = run.run_id
    with sqlite3.connect(root / "old" / "results.db") as db:
        db.executescript("DROP TABLE evals;" + PREVIOUS_EVALS + "DROP TABLE beam_sweep;" + PREVIOUS_BEAM_SWEEP)
        db.executemany("INSERT INTO beam_sweep VALUES (?, 'dev-clean', 'wordbeam', ?, 1.0, 20.0, 8.0, 7.5, 10, 'cpu')",
                       [(run_id, b) for b in (16, 64)])
        db.executemany("INSERT INTO evals VALUES (?, ?, 'dev-clean', 'greedy', 1, ?, 1.0, 1.0, ?, ?, ?, 10, ?, "
                       "?, ?, ?, ?)",
                       [(run_id, e, 60.0 * e, 2 * c, c, c, int(e == 5), c - 1, c + 1, 2 * c - 2, 2 * c + 2)
                        for e, c in enumerate(CERS, 1)])
    return root / "old"


def test_a_previous_release_run_reads_as_before(tmp_path, capsys):
    from speechperf.cli import main
    from speechperf.studies.report.html import build_report

    old = _previous_release_run(tmp_path)
    assert main(["tta", str(old), "--targets", "10", "--json"]) == 0
    study = json.loads(capsys.readouterr().out)
    assert [(r["target"], r["minutes"], r["error at TTA"]) for r in study["runs"]] == [(10.0, 4.0, 9.0)]
    assert [(e["cer"], e["cer_lo"], e["wer"], e["ser"], e["ser_lo"]) for e in study["evaluations"]] == [
        (c, c - 1, 2 * c, None, None) for c in CERS[:4]]  # SER: not measured, never 0
    assert main(["tta", str(old), "--metric", "ser", "--targets", "50"]) == 2
    assert "run 'old' did not measure SER" in capsys.readouterr().err
    index = build_report([old], tmp_path / "report")
    with open(index.parent / "validation.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == ["run", "workload", "epoch", "clock min", "split", "CER %", "CER 95% low", "CER 95% high",
                             "WER %", "WER 95% low", "WER 95% high", "utterances"]  # its columns, no SER
    with open(index.parent / "final.csv", newline="") as f:
        assert "SER %" not in next(csv.DictReader(f))
    with open(index.parent / "beam_sweep.csv", newline="") as f:
        sweep = list(csv.DictReader(f))
    assert [(r["beam"], r["CER %"], r["WER %"], r["CER paper %"]) for r in sweep] == [("16", "8.0", "20.0", "7.5"),
                                                                                     ("64", "8.0", "20.0", "7.5")]
    assert "SER %" not in sweep[0] and sweep[0]["CER 95% low"] == ""  # not measured then: no column, no value
    with sqlite3.connect(old / "results.db") as db:
        assert "ser" not in {r[1] for r in db.execute("PRAGMA table_info(evals)")}  # readers never migrate


def test_a_previous_release_database_opened_for_writing_gets_the_declared_columns(tmp_path):
    from speechperf.results import ResultsDB

    old = _previous_release_run(tmp_path)
    with ResultsDB(old / "results.db") as db:
        cols = [r["name"] for r in db.query("PRAGMA table_info(evals)")]
        assert set(metric.columns()) <= set(cols)
        rows = db.query("SELECT cer, ser FROM evals ORDER BY epoch")
        sweep_cols = [r["name"] for r in db.query("PRAGMA table_info(beam_sweep)")]
        assert set(metric.columns()) <= set(sweep_cols)  # the beam sweep holds every declared metric too
        sweep = db.query("SELECT beam, cer, ser FROM beam_sweep ORDER BY beam")
    assert rows == [{"cer": c, "ser": None} for c in CERS]  # older rows: NULL, not 0
    assert sweep == [{"beam": 16, "cer": 8.0, "ser": None}, {"beam": 64, "cer": 8.0, "ser": None}]


def test_a_tta_of_a_run_resumed_across_the_release_counts_an_unmeasured_epoch_as_not_reached():
    from speechperf.scoring.target_rule import epochs_to_target

    # epoch 1 from before SER existed: the median of 3 holds at epoch 3 whatever it was; of 2, from epoch 3 on
    assert epochs_to_target([(60, None), (120, 40.0), (180, 40.0)], 50.0, 3) == 3
    assert epochs_to_target([(60, None), (120, 40.0), (180, 40.0)], 50.0, 2) == 3
    with pytest.raises(SpeechperfError):
        epochs_to_target([], 1.0, 0)


def test_the_stop_rule_watches_the_metric_named_by_train_target_metric(monkeypatch):
    from speechperf.config import load_preset
    from speechperf.train import loop
    from speechperf.results.progress import Progress
    from speechperf.train.recorder import Recorder

    class History(Recorder):  # rank 0's part of the recorder the stop rule reads: the history's entries
        def evaluated(self, r, final):
            self.prog.evals.append(metric.entry(60.0 * (len(self.prog.evals) + 1), r))

    sers = iter([60.0, 40.0, 40.0])
    monkeypatch.setattr(loop, "_evaluate", lambda *a, **kw: {"loss": 1.0, "cer": 90.0, "wer": 95.0, "ser": next(sers)})
    cfg = load_preset("tiny", ["train.stop.target_metric=ser", "train.stop.target=45", "train.stop.target_epochs=2"])
    rec = History(Progress(), "RUN")
    # medians of the last 2 SERs: -, 50, 40: the target 45 is reached at the third epoch (CER never would)
    trainer = SimpleNamespace(cfg=cfg, rec=rec)  # what the epoch's evaluation reads of the trainer
    assert [loop._epoch_eval(None, trainer)[0] for _ in range(3)] == [None, None, "success"]


def test_a_curve_holds_every_target_metric_and_compares_those_the_reference_recorded():
    from speechperf.studies import curve

    assert curve.METRICS == ("loss", *metric.targets())
    mine = curve.curve_of([{"epoch": 1, "loss": 2.0, "cer": 50.0, "wer": 90.0, "ser": 100.0, "cer_paper": 40.0}])
    assert mine == [{"epoch": 1, "loss": 2.0, "cer": 50.0, "wer": 90.0, "ser": 100.0}]
    before_ser = [{"epoch": 1, "loss": 2.0, "cer": 50.0, "wer": 90.0}]  # a reference recorded before SER
    assert curve.compare(mine, before_ser)["verdict"] == curve.IDENTICAL
    other_ser = [{**before_ser[0], "ser": 95.0}]
    got = curve.compare(mine, other_ser)
    assert (got["verdict"], got["first"]["metric"]) == (curve.DIFFERS, "ser")
    assert got["text"] == ("differs from epoch 1: CER 50.0 vs 50.0, WER 90.0 vs 90.0, SER 100.0 vs 95.0, "
                           "loss 2.0 vs 2.0")


def test_a_reference_curve_needs_the_loss_and_a_target_metric_not_every_one():
    from speechperf.studies import rcp

    settings = {"features_sha256": "ab", "torch": "2.13.0+cpu", "seed": 1}
    rcp._check_curve({"epochs": [{"epoch": 1, "loss": 2.0, "cer": 50.0, "wer": 90.0}], "settings": settings},
                     "curves[0]", "tiny.json")  # measured before SER: read, compared on what it holds
    with pytest.raises(rcp.ReferenceError, match=r"'curves\[0\].epochs\[0\]' should be an epoch with the loss and "
                                                 r"a target metric \(cer, wer, ser\), found \['epoch', 'loss'\]"):
        rcp._check_curve({"epochs": [{"epoch": 1, "loss": 2.0}], "settings": settings}, "curves[0]", "tiny.json")
    with pytest.raises(rcp.ReferenceError, match=r"'curves\[0\].epochs\[0\].ser' should be a finite number >= 0"):
        rcp._check_curve({"epochs": [{"epoch": 1, "loss": 2.0, "cer": 5.0, "ser": -1.0}], "settings": settings},
                         "curves[0]", "tiny.json")
