"""``speechperf bench feed``: the cores arithmetic, the recorded profiles, and the command on a
CPU (appetite measured on the CPU with the tiny preset, or taken from the recorded profile)."""
from __future__ import annotations

import json
import re

import numpy as np
import pytest

from speechperf.cli import main
from speechperf.errors import SpeechperfError
from speechperf.bench import feed

SMALL = ["--windows", "2", "--steps", "1", "--warmup", "1", "loader.bucket_window=1"]  # supply: windows of 1 shard


def test_readers_per_gpu_rounds_up_and_a_host_keeps_one_core_per_gpu():
    assert feed.readers_per_gpu(13800.0, 6000.0) == 3
    assert feed.readers_per_gpu(12000.0, 6000.0) == 2
    assert feed.gpus_fed(16, 3) == 4.0
    assert feed.gpus_fed(2, 2) == pytest.approx(2 / 3)
    with pytest.raises(SpeechperfError, match="must be > 0"):
        feed.readers_per_gpu(100.0, 0.0)


def test_summary_is_the_median_and_the_spread_over_it():
    assert feed.summary([0.2, 0.1, 0.4]) == (0.2, pytest.approx(150.0))


def test_the_supply_is_timed_over_whole_loader_windows():
    """A reader decompresses a window's shards for its first batch: spans of whole windows, one
    window per reader, or the timing falls on either side of that work."""
    groups = np.array([0, 0, 0, 1, 1, 2, 2, 2, 3, 3])  # the window of each planned batch
    assert feed.span_ends(groups, readers=1, spans=3) == [2, 4, 7]
    assert feed.span_ends(groups, readers=2, spans=2) == [4, 9]
    assert feed.span_ends(np.arange(4), readers=1, spans=4) == [0, 1, 2, 3]  # SortaGrad's: a window a batch
    with pytest.raises(SpeechperfError, match="6 windows, and an epoch holds 4"):
        feed.span_ends(groups, readers=2, spans=3)
    assert feed.supply_utterances(readers=2, windows=3, window_shards=8) == 4 * 2 * 8 * feed.SHARD_UTTS


def test_a_supply_read_at_other_lengths_than_the_appetite_is_said():
    row = {"appetite source": "src", "appetite audio s/s": 13800.0, "supply audio s/s per reader": 3500.0,
           "supply data": "feats", "readers": 1, "readers per GPU": 4, "host cores": 2, "GPUs this host feeds": 0.4,
           "mean utt s": 13.5, "supply mean utt s": 4.0}
    (warning,) = feed.notes(row)[2:]
    assert warning.startswith("warning: the supply was read at 4.0 s an utterance and the appetite at 13.5 s")
    assert len(feed.notes({**row, "supply mean utt s": 12.3})) == 2  # within 25%: nothing to say


def test_recorded_profile_rows_carry_device_torch_commit_date_and_source():
    row = feed.recorded("gpu")
    assert (row["name"], row["batch"], row["audio_s_per_s"], row["s_per_step"]) == ("h100-2026-11-25", 240, 13800.0, 0.235)
    assert row["torch"] == "2.11.0+cu130" and row["commit"] == "68d6c71" and "bench_gpu_appetite" in row["source"]
    with pytest.raises(SpeechperfError, match="records no appetite for preset 'tiny'"):
        feed.recorded("tiny")
    with pytest.raises(SpeechperfError, match="no profile 'a100'"):
        feed.recorded("gpu", "a100")


def test_synthetic_shards_are_at_librispeech_lengths(tmp_path):
    from speechperf.data.loader import load_index

    ix = load_index(feed.write_synthetic(tmp_path, utterances=150), ["train-feed"])
    mean = float(ix.duration.mean())
    assert 10.5 < mean < 14.0 and len(ix.duration) == 150
    chars = [len(ix.transcript(u)) / ix.duration[u] for u in range(len(ix))]  # English-like words, 15 a second
    assert 12 < min(chars) and max(chars) <= 15.0 and " the " in " ".join(ix.transcript(u) for u in range(20))


def test_bench_feed_on_cpu_measures_both_sides(capsys):
    assert main(["bench", "feed", "--preset", "tiny", "--device", "cpu", "--json", *SMALL, "loader.batch_size=2"]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert row["appetite source"].startswith("measured on CPU (cpu), fp32, 2 windows of 1 steps")
    assert row["batch"] == 2 and row["appetite audio s/s"] > 0 and row["supply audio s/s per reader"] > 0
    assert row["supply data"] == "synthetic, 1-shard windows" and 10.5 < row["supply mean utt s"] < 16.0
    assert row["readers per GPU"] == feed.readers_per_gpu(row["appetite audio s/s"], row["supply audio s/s per reader"])
    assert row["GPUs this host feeds"] == round(row["host cores"] / (row["readers per GPU"] + 1), 2)


def test_the_appetite_steps_the_model_a_run_would_train(monkeypatch, capsys):
    """fp8's float8 Linear layers and train.system.compile are applied as a run applies them (they were
    accepted and ignored); CUDA graphs, which a run replays per planned shape, are refused by name."""
    seen = []
    monkeypatch.setattr(feed.fp8, "prepare", lambda model, precision, device: seen.append(("fp8", precision)))
    monkeypatch.setattr(feed, "compiled", lambda model: seen.append(("compiled", type(model).__name__)) or model)
    assert main(["bench", "feed", "--preset", "conformer-cpu", "--device", "cpu", "--json", *SMALL,
                 "loader.batch_size=2", "model.layers=1", "model.d_model=32", "model.heads=2",
                 "model.subsampling_channels=16", "train.system.compile=true", "train.system.precision=fp32"]) == 0
    assert seen == [("fp8", "fp32"), ("compiled", "Conformer")]
    capsys.readouterr()
    assert main(["bench", "feed", "--preset", "tiny", "--device", "cpu", *SMALL, "train.system.cuda_graphs=true"]) == 2
    assert "bench feed: train.system.cuda_graphs=true is not measured here" in capsys.readouterr().err


def test_bench_feed_without_a_gpu_names_the_recorded_profile(capsys):
    assert main(["bench", "feed", "--preset", "conformer", "--cores", "16", *SMALL, "loader.batch_size=8"]) == 0
    out = capsys.readouterr().out
    assert "appetite from recorded profile h100-2026-11-25 (NVIDIA H100" in out and "no GPU here" in out
    assert "5260" in out and "this host's 16 cores feed" in out


def test_bench_feed_refuses_a_folder_without_training_splits(tmp_path, capsys):
    assert main(["bench", "feed", "--preset", "tiny", "--device", "cpu", "--data", str(tmp_path), *SMALL]) == 2
    assert f"{tmp_path}: no prepared training split" in capsys.readouterr().err


def test_a_resident_preset_s_readers_are_said_to_feed_the_first_epoch_only():
    row = {"appetite source": "src", "appetite audio s/s": 13800.0, "supply audio s/s per reader": 4800.0,
           "supply data": "synthetic", "readers": 1, "readers per GPU": 3, "host cores": 16, "GPUs this host feeds": 4.0,
           "mean utt s": 13.5, "supply mean utt s": 13.2}
    assert len(feed.notes(row)) == 2  # a row of before the field: streaming
    (said,) = feed.notes({**row, "resident": True})[2:]
    assert said.startswith("loader.resident: the 3 reader cores per GPU feed the first epoch only")


@pytest.mark.parametrize("option,value,says", [("--readers", "0", "must be at least 1"),
                                               ("--readers", "-1", "must be at least 1"),
                                               ("--readers", "1000000000", "at most 256 reader processes"),
                                               ("--windows", "0", "must be at least 1"),
                                               ("--steps", "0", "must be at least 1"),
                                               ("--warmup", "-1", "must be at least 0"),
                                               ("--cores", "0", "must be at least 1")])
def test_bench_feed_refuses_counts_it_cannot_measure_with(option, value, says, capsys):
    """Issue 48: each was a traceback (StatisticsError, IndexError, a 14.9 TiB allocation)."""
    assert main(["bench", "feed", "--preset", "tiny", "--device", "cpu", option, value]) == 2
    assert capsys.readouterr().err.strip() == f"speechperf: error: bench feed {option} {value}: {says}"


def test_bench_feed_trains_a_bpe_preset_s_units_on_its_synthetic_set(capsys):
    # before: the supply's loader found no units in the synthetic folder and failed after the appetite
    args = ["bench", "feed", "--preset", "tiny", "--device", "cpu", "--json", *SMALL, "loader.batch_size=2"]
    assert main([*args, "loader.units=bpe:40", "model.num_classes=41"]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert row["supply audio s/s per reader"] > 0
    rate = re.search(r"labels at ([\d.]+)/s: synthetic English-like transcripts at 15 characters/s in bpe:40",
                     row["appetite source"])
    assert rate and 3 < float(rate.group(1)) < 15  # subword units: fewer labels than characters


def test_a_corpus_gives_its_own_labels_per_second_in_its_units(tiny_features, tmp_path):
    """A transducer's joint grows with the labels: on a corpus the appetite's labels come at the rate
    of its training transcripts in the preset's units (subword units: fewer than characters)."""
    from speechperf.data.index import load
    from speechperf.data.units import ensure_units

    import shutil

    feats = shutil.copytree(tiny_features, tmp_path / "feats")  # its BPE model is written beside the features
    splits = feed.train_splits(feats)
    ix = load(feats, splits)
    chars = sum(len(ix.transcript(u)) for u in range(len(ix))) / float(ix.duration.sum())
    rate, note = feed.label_rate(feats, ensure_units(feats, "char", splits))
    assert rate == pytest.approx(chars, rel=0.05) and note.startswith(f"labels at {rate:.3g}/s: {feats}'s training")
    bpe, _ = feed.label_rate(feats, ensure_units(feats, "bpe:64", splits))
    assert 0 < bpe < rate
    b = feed.synthetic_batch(np.array([10.0, 8.0]), np.random.default_rng(0), feed.torch.device("cpu"), 4.0)
    assert b.label_lens.tolist() == [40, 32]


def test_bench_feed_checks_the_folder_s_units_before_the_appetite(tmp_path, monkeypatch, capsys):
    # found: `bench feed --preset transducer --data FEATS` measured the appetite for 7.7 min, then
    # failed on the missing BPE model; now the folder is settled first (one whose model is not its record's:
    # refused at once; a read-only folder cannot stand in, as root writes into it)
    feats = feed.write_synthetic(tmp_path / "f", 2 * feed.SHARD_UTTS)
    (feats / "units").mkdir()
    (feats / "units" / "bpe-40.model").write_bytes(b"not a model")
    (feats / "units" / "bpe-40.json").write_text(json.dumps({"units": "bpe:40", "sha256": "0" * 64}))
    monkeypatch.setattr(feed, "measured_appetite", lambda *a: pytest.fail("the appetite ran before the units"))
    code = main(["bench", "feed", "--preset", "tiny", "--device", "cpu", "--data", str(feats), *SMALL,
                 "loader.units=bpe:40", "model.num_classes=41"])
    assert code == 2 and f"{feats}/units/bpe-40.model has sha256" in capsys.readouterr().err


@pytest.mark.timeout(300)
@pytest.mark.parametrize("to_group", [False, True])
def test_a_sigterm_stops_bench_feed_and_removes_its_synthetic_set(tmp_path, to_group):
    """SIGTERM (to the process, or to its group as a scheduler sends it) ends the command as a stop:
    exit 143, said, and its temporary set of synthetic shards (hundreds of MB at the defaults) gone."""
    import os

    from tests.conftest import cli_start, sigterm_when_ready

    p = cli_start("bench", "feed", "--preset", "tiny", "--device", "cpu", "--windows", "3", "--steps", "3",
                  "--warmup", "1", session=True, fresh=True,  # fresh: a forked child keeps the server's TMPDIR
                  env={**os.environ, "TMPDIR": str(tmp_path)})
    rc, err = sigterm_when_ready(p, lambda: bool(list(tmp_path.glob("speechperf-feed-*/train-feed/*.npz"))),
                                 to_group)
    assert rc == 143, err[-2000:]
    assert "speechperf: error: stopped by SIGTERM" in err and "Traceback" not in err
    assert not list(tmp_path.glob("speechperf-feed-*"))
    with pytest.raises(ProcessLookupError):
        os.killpg(p.pid, 0)  # nothing of its process group (the supply's readers) outlives it
