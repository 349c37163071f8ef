"""Sentence error rate (SER): the share of utterances with any word error, as Kaldi's compute-wer
prints %SER; with its bootstrap interval, in ``tta --metric ser --json`` and in the report."""
import csv
import json

import jiwer
import numpy as np
import pytest

from speechperf.scoring.bootstrap import error_intervals, resample_indices
from speechperf.scoring.error_rates import utterance_errors
from speechperf.results.run import Run

# by hand: 0 the same; 1 one substitution; 2 only the spacing differs (the same words: no error,
# though CER counts an edit); 3 one deletion; 4 one insertion; 5 empty hypothesis; 6 the same
REFS = ["the cat sat", "a dog ran", "hello world", "one two three", "so it goes", "good night", "yes"]
HYPS = ["the cat sat", "a dig ran", "hello  world", "one three", "so it goes on", "", "yes"]
BY_HAND = [0, 1, 0, 1, 1, 1, 0]  # 4 of 7 utterances in error


def test_ser_counts_utterances_with_any_word_error_as_counted_by_hand():
    u = utterance_errors(REFS, HYPS)
    assert u.sentence_errors.tolist() == BY_HAND
    assert u.sentences.tolist() == [1] * len(REFS)
    assert u.char_edits[2] == 1  # CER sees the extra space, SER does not
    got = error_intervals(u)
    assert got["ser"] == 100.0 * 4 / 7


def test_ser_agrees_with_jiwers_per_sentence_alignments():
    out = jiwer.process_words(REFS, HYPS)  # one alignment per sentence, jiwer's default word transform
    in_error = [int(any(chunk.type != "equal" for chunk in sentence)) for sentence in out.alignments]
    assert utterance_errors(REFS, HYPS).sentence_errors.tolist() == in_error == BY_HAND


def test_ser_interval_is_the_bootstrap_of_the_same_draws_as_cer_and_wer():
    u = utterance_errors(REFS, HYPS)
    idx = resample_indices(len(REFS))
    errors = np.array(BY_HAND)[idx].sum(axis=1)  # utterances in error in each resampled set of 7
    low, high = np.percentile(100.0 * errors / len(REFS), [2.5, 97.5])
    got = error_intervals(u)
    assert (got["ser_lo"], got["ser_hi"]) == pytest.approx((low, high), abs=1e-12)
    assert got["ser_lo"] < got["ser"] < got["ser_hi"]
    perfect = error_intervals(utterance_errors(REFS, REFS))
    assert (perfect["ser"], perfect["ser_lo"], perfect["ser_hi"]) == (0.0, 0.0, 0.0)


SERS = [80.0, 60.0, 40.0, 40.0]  # per epoch: SER 50 first held (median of the last 3) at epoch 4


def _run_with_ser(root, name: str):
    config = {"model": {"name": "ds2", "conv_channels": 8, "lstm_layers": 1, "lstm_hidden": 8},
              "train": {"seed": 1, "eval_split": "dev-clean"}}
    with Run.create(root / name, kind="train", config=config, env={"cpu_model": "Test CPU"}, label=name) as run:
        run.rows.add_iteration({"iteration": 1, "epoch": 1, "clock_s": 1.0, "loss": 5.0, "batch_size": 2, "frames": 100,
                           "audio_s": 2.0, "step_s": 1.0, "utts_per_s": 2.0, "audio_s_per_s": 2.0})
        run.rows.flush()
        run.rows.insert("evals", [{"run_id": run.run_id, "epoch": e, "split": "dev-clean", "decoder": "greedy", "beam": 1,
                              "clock_s": 60.0 * e, "eval_s": 1.0, "loss": 1.0, "n_utts": 10, "final": int(e == 5),
                              "cer": 20.0, "wer": 30.0, "cer_paper": 19.0, "ser": ser, "ser_lo": ser - 10,
                              "ser_hi": ser + 10} for e, ser in enumerate(SERS + [35.0], 1)])
        run.rows.set_status("success")
        run.write_summary({"status": "success", "init_s": 1.0})
    return root / name


def test_tta_metric_ser_json(tmp_path, capsys):
    from speechperf.cli import main

    run = _run_with_ser(tmp_path, "ser-run")
    assert main(["tta", str(run), "--metric", "ser", "--targets", "50", "--json"]) == 0
    study = json.loads(capsys.readouterr().out)
    row = study["runs"][0]
    assert (row["metric"], row["target"], row["minutes"], row["epochs to target"]) == ("ser", 50.0, 4.0, 4)
    assert (row["error at TTA"], row["error 95% low"], row["error 95% high"]) == (40.0, 30.0, 50.0)
    assert [(e["epoch"], e["ser"], e["ser_lo"], e["ser_hi"]) for e in study["evaluations"]] == [
        (e, s, s - 10, s + 10) for e, s in enumerate(SERS, 1)]
    # the paper's targets have no SER: refused, saying what to give
    assert main(["tta", str(run), "--metric", "ser"]) == 2
    assert "--targets paper has targets of CER and WER only, none of SER" in capsys.readouterr().err


def test_report_shows_ser(tmp_path, monkeypatch):
    from speechperf.studies.report import figures
    from speechperf.studies.report.html import build_report

    titles, save = {}, figures.save_png

    def keep_titles(fig, path):
        titles[path.name] = [ax.get_title() for ax in fig.axes]
        return save(fig, path)

    monkeypatch.setattr(figures, "save_png", keep_titles)
    run = _run_with_ser(tmp_path, "ser-run")
    index = build_report([run], tmp_path / "report", targets="50", metric="ser")
    with open(index.parent / "validation.csv", newline="") as f:
        validation = list(csv.DictReader(f))
    assert [(r["SER %"], r["SER 95% low"], r["SER 95% high"]) for r in validation] == [
        (str(s), str(s - 10), str(s + 10)) for s in SERS]
    with open(index.parent / "final.csv", newline="") as f:
        assert [r["SER %"] for r in csv.DictReader(f)] == ["35.0"]
    with open(index.parent / "tta.csv", newline="") as f:
        assert [(r["metric"], r["target %"], r["TTA minutes"]) for r in csv.DictReader(f)] == [("SER", "50.0", "4.0")]
    assert titles["fig7.png"][1:] == ["validation CER %", "validation WER %", "validation SER %"]
    assert "SER: utterances with any word error / utterances" in index.read_text()
