"""The evaluation pass: its loader (in order, every reader given work), its decode threads, its
decoder built once, its intervals off the TTA clock and its seconds by part."""
import time
from dataclasses import replace
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from speechperf.config import load_preset
from speechperf.data.units import CHAR_UNITS
from speechperf.data.batching import Batching
from speechperf.data.index import librispeech_like
from speechperf.data.loader import owners
from speechperf.data.plan import plan_epoch
from speechperf.models import build_model
from speechperf.results.progress import Progress
from speechperf.train import evaluate as ev
from speechperf.train.recorder import Recorder


def test_every_reader_gets_a_share_of_a_dev_split_and_one_reader_keeps_the_training_windows():
    dev = librispeech_like(0, splits=(2_703,))  # dev-clean's size: 43 shards of 64
    shards = len(dev.keys)
    for preset in ("gpu", "modern", "conformer", "conformer-algoperf-sizes", "paper"):
        train = replace(load_preset(preset).loader, eval_max_duration=0.0)  # training-sized batches
        cfg = Batching(train).for_eval(dev)
        assert not cfg.shuffle and cfg.mode == "bucket" and not cfg.sort_first_epoch
        assert (cfg.max_duration, cfg.batch_size) == (train.max_duration, train.batch_size)  # the training batches
        plan = plan_epoch(dev, cfg, 0, 0)
        assert set(owners(plan, cfg.readers).tolist()) == set(range(cfg.readers)), preset  # none idle
        assert sorted(np.concatenate(plan.batches).tolist()) == list(range(len(dev.frames)))  # every utterance once
        whole = plan_epoch(dev, replace(cfg, bucket_window=train.bucket_window), 0, 0)
        if train.bucket_window >= shards:  # the training window: one run, one reader did it all
            assert set(owners(whole, cfg.readers).tolist()) == {0}
    for preset in ("cpu", "conformer-cpu", "tiny"):  # one reader (or none): the windows the references used
        train = load_preset(preset).loader
        assert Batching(train).for_eval(dev).bucket_window == train.bucket_window


def windows(cfg, index) -> int:
    return len(set(plan_epoch(index, cfg, 0, 0).groups.tolist()))


def test_evaluation_sized_batches_fill_windows_that_hold_them():
    dev = librispeech_like(0, splits=(2_703,))  # 43 shards, ~33,000 s of audio
    train = load_preset("gpu").loader
    for size, want in ((4000.0, 2), (1000.0, 8), (40_000.0, 1)):  # 2 windows of 4 batches' audio; a reader each; one
        cfg = Batching(replace(train, eval_max_duration=size)).for_eval(dev)
        plan = plan_epoch(dev, cfg, 0, 0)
        assert (cfg.max_duration, windows(cfg, dev)) == (size, want), size
        assert max(len(b) * dev.duration[b].max() for b in plan.batches) <= size  # padded seconds, as asked
        assert sorted(np.concatenate(plan.batches).tolist()) == list(range(len(dev.frames)))
        assert not cfg.shuffle and cfg.mode == "bucket" and not cfg.sort_first_epoch
    one = Batching(replace(train, eval_max_duration=4000.0, readers=0)).for_eval(dev)  # in-process: one sorted window
    assert windows(one, dev) == 1
    sized = plan_epoch(dev, Batching(replace(train, eval_max_duration=4 * train.max_duration)).for_eval(dev), 0, 0)
    training_sized = plan_epoch(dev, Batching(replace(train, eval_max_duration=0.0)).for_eval(dev), 0, 0)
    assert 3 * len(sized) < len(training_sized)  # 4x the audio a batch: more than 3x fewer batches


# ---- the evaluation's decode pool, decoder reuse, intervals off the clock ----------------------



CPU = torch.device("cpu")
TIMINGS = ("eval_s", "eval_forward_s", "eval_decode_s", "eval_score_s", "decode_busy_s", "decode_cpu_s")


def tiny_model():
    cfg = load_preset("tiny", ["threads=1"])
    torch.manual_seed(0)
    return build_model(cfg.model), cfg


def run_eval(feats, workers=1, beam=8, **kw):
    model, cfg = tiny_model()
    return ev.evaluate(model, feats, "dev-clean", Batching(cfg.loader), CPU, decoder="beam", beam=beam,
                       workers=workers, keep_pairs=100_000, **kw)


def without(r: dict, keys) -> dict:
    return {k: v for k, v in r.items() if k not in keys}


def test_decoded_text_with_n_threads_equals_one_threads(tiny_features):
    one, three = run_eval(tiny_features, workers=1), run_eval(tiny_features, workers=3)
    assert len({p["hyp"] for p in one["pairs"]}) > 1  # the untrained model's texts differ: an order mix-up would show
    assert one["pairs"] == three["pairs"]
    assert (one["decode_threads"], three["decode_threads"]) == (1, 3)
    assert without(one, TIMINGS + ("decode_threads",)) == without(three, TIMINGS + ("decode_threads",))


def test_the_parts_sum_to_the_evaluation_seconds(tiny_features):
    r = run_eval(tiny_features)
    assert all(r[k] >= 0 for k in TIMINGS)
    assert r["eval_forward_s"] + r["eval_decode_s"] + r["eval_score_s"] == pytest.approx(r["eval_s"], abs=1e-6)
    assert r["decode_frames"] > 0


def test_intervals_computed_after_equal_those_computed_inside(tiny_features):
    refs = ["the cat sat on the mat", "a dog ran", "the cool book", "off we go now", "a good day"]
    hyps = ["the cat sat on a mat", "a dog ran", "the col book", "of we go", ""]
    later = ev.score(refs, hyps, intervals=False)
    assert "errors" in later and not any(k.endswith(("_lo", "_hi")) for k in later)
    assert ev.with_intervals(later) == ev.score(refs, hyps)  # the point values too, bit for bit
    inside, after = run_eval(tiny_features), run_eval(tiny_features, intervals=False)
    assert "cer_lo" in inside and "cer_lo" not in after
    assert without(ev.with_intervals(after), TIMINGS) == without(inside, TIMINGS)
    with pytest.raises(ValueError, match="no per-utterance errors"):
        ev.with_intervals(inside)


def test_the_decoder_is_built_once_and_reused_by_every_evaluation(tiny_features, monkeypatch):
    from speechperf.train.warmup import warm_decoder

    built = []
    real = ev.get_decoder
    monkeypatch.setattr(ev, "get_decoder", lambda *a, **k: built.append(k["beam"]) or real(*a, **k))
    monkeypatch.setattr(ev, "_DECODERS", {})
    warm_decoder("beam", 8, tiny_features)  # the run's initialization
    run_eval(tiny_features)
    run_eval(tiny_features)
    assert built == [8]
    run_eval(tiny_features, beam=16)  # the final evaluation's width: built once too
    run_eval(tiny_features, beam=16)
    assert built == [8, 16]


class _Kept(Recorder):
    """The base recorder with the clock readings and rows of its evaluations kept."""

    def evaluated(self, r: dict, final: bool) -> None:
        self.rows.append((self.now(), r))


def test_the_epoch_evaluation_computes_its_intervals_off_the_clock(tiny_features, tmp_path, monkeypatch):
    from speechperf.train import loop

    slow = 0.5
    real = ev.error_intervals

    def slow_intervals(u):
        time.sleep(slow)
        return real(u)

    monkeypatch.setattr(ev, "error_intervals", slow_intervals)
    model, _ = tiny_model()
    cfg = load_preset("tiny", ["threads=1", "train.eval.decoder=beam", "train.eval.beam=8"])
    rec = _Kept(Progress(), tmp_path)
    rec.rows = []
    rec.initialized("fresh", 0.0, {})
    wall0, clock0 = time.perf_counter(), rec.now()
    trainer = SimpleNamespace(cfg=cfg, rec=rec, data=tiny_features, batching=Batching(cfg.loader),
                              group=SimpleNamespace(device=CPU), units=CHAR_UNITS)  # what the epoch's evaluation reads of it
    loop._epoch_eval(model, trainer)
    wall, (clock, r) = time.perf_counter() - wall0, rec.rows[0]
    assert "cer_lo" in r and "errors" not in r  # the row carries the intervals
    assert wall - (clock - clock0) >= slow - 0.05  # ... computed while the clock stood still
    assert r["eval_s"] < wall - slow + 0.05  # and not counted in the evaluation's seconds


# ---- the evaluation split's batches kept resident ---------------------------------------------


@pytest.fixture
def released():
    ev.release_resident()
    yield
    ev.release_resident()


def test_the_resident_evaluation_returns_exactly_the_streaming_one(tiny_features, released, monkeypatch):
    _, cfg = tiny_model()
    streamed = run_eval(tiny_features)
    kept = ev.keep_resident(tiny_features, "dev-clean", Batching(cfg.loader), CPU, max_mb=64)
    assert kept is not None and kept.where == "host" and kept.nbytes > 0
    monkeypatch.setattr(ev, "make_loader", lambda *a, **k: pytest.fail("a resident evaluation read the shards"))
    resident = run_eval(tiny_features)
    assert (streamed["eval_data"], resident["eval_data"]) == ("stream", "host")
    assert len({p["hyp"] for p in resident["pairs"]}) > 1  # distinct texts: a batch order mix-up would show
    rest = TIMINGS + ("eval_data",)
    assert without(resident, rest) == without(streamed, rest)  # loss, every metric, interval, text: exact
    assert without(run_eval(tiny_features), rest) == without(resident, rest)  # reused: the same again


def test_the_kept_bytes_are_the_padded_features_and_a_split_over_the_bound_streams(tiny_features, released):
    from speechperf.data.loader import load_index

    _, cfg = tiny_model()
    kept = ev.keep_resident(tiny_features, "dev-clean", Batching(cfg.loader), CPU, max_mb=64)
    assert kept.nbytes == sum(b.feats.numel() * 4 for b in kept.batches)
    assert len(kept.batches) == len(ev.eval_batches(tiny_features, "dev-clean", Batching(cfg.loader)))
    assert sum(len(b.ids) for b in kept.batches) == len(load_index(tiny_features, ["dev-clean"]).frames)
    under = (kept.nbytes - 1) / 2**20  # one byte short of holding them
    assert ev.keep_resident(tiny_features, "dev-clean", Batching(cfg.loader), CPU, max_mb=under) is None
    assert run_eval(tiny_features)["eval_data"] == "stream"  # nothing kept: the shards are read
    assert ev.keep_resident(tiny_features, "dev-clean", Batching(cfg.loader), CPU, max_mb=0) is None


def test_kept_batches_serve_only_their_split_settings_and_device(tiny_features, released):
    _, cfg = tiny_model()
    ev.keep_resident(tiny_features, "dev-clean", Batching(cfg.loader), CPU, max_mb=64)
    other = Batching(replace(cfg.loader, normalize=not cfg.loader.normalize))
    r = ev.evaluate(tiny_model()[0], tiny_features, "dev-clean", other, CPU, decoder="greedy")
    assert r["eval_data"] == "stream"
    assert run_eval(tiny_features)["eval_data"] == "host"


def test_initialization_keeps_the_eval_split_within_the_configured_bound(tiny_features, released):
    from speechperf.train.warmup import initialize

    for bound, where in ((64, "host"), (0, "stream")):
        model, _ = tiny_model()
        cfg = load_preset("tiny", ["threads=1", f"train.eval.resident_mb={bound}"])
        parts = initialize(model, cfg, Batching(cfg.loader), tiny_features, CPU)
        assert (parts["eval_data_mb"] > 0) == (bound > 0)
        assert run_eval(tiny_features)["eval_data"] == where


# ---- evaluation-sized batches give the training-sized batches' result ------------------------


@pytest.mark.parametrize("preset,overrides", [
    ("tiny", ["threads=1"]),  # DS2: unidirectional LSTMs, batch norm on running statistics
    ("conformer-cpu", ["threads=1", "batch_size=3", "model.layers=1", "model.d_model=32", "model.heads=2"]),  # masked
])
def test_evaluation_sized_batches_give_the_same_loss_metrics_and_texts(tiny_features, released, preset, overrides):
    from speechperf.data.loader import load_index

    cfg = load_preset(preset, overrides)
    torch.manual_seed(0)
    model = build_model(cfg.model)
    index = load_index(tiny_features, ["dev-clean"])
    whole = len(index) * float(index.duration.max())  # the whole split padded to its longest: one batch
    sized = Batching(replace(cfg.loader, eval_max_duration=whole))
    train_plan = ev.eval_batches(tiny_features, "dev-clean", Batching(cfg.loader), index).plan
    assert len(ev.eval_batches(tiny_features, "dev-clean", sized, index).plan) == 1 < len(train_plan)

    def run(batching):
        return ev.evaluate(model, tiny_features, "dev-clean", batching, CPU, decoder="beam", beam=8, workers=1,
                           keep_pairs=100_000)

    small, large = run(Batching(cfg.loader)), run(sized)
    assert len({p["hyp"] for p in small["pairs"]}) > 1  # distinct texts: a mix-up of utterances would show
    assert large["pairs"] == small["pairs"]  # scored in utterance-id order, whatever the batches' order
    assert large["loss"] == pytest.approx(small["loss"], rel=1e-6)  # sums in another order, no more
    # every metric and interval exactly: the bootstrap draws by position in the id order
    rest = TIMINGS + ("loss", "eval_data")
    assert without(large, rest) == without(small, rest) and "cer_lo" in small


def test_scores_intervals_and_kept_pairs_do_not_depend_on_the_batches_order(tiny_features, released, monkeypatch):
    model, cfg = tiny_model()
    batches = list(ev.eval_batches(tiny_features, "dev-clean", Batching(cfg.loader)))
    assert len(batches) > 1

    def run(order):
        monkeypatch.setattr(ev, "eval_batches", lambda *a, **k: order)
        return ev.evaluate(model, tiny_features, "dev-clean", Batching(cfg.loader), CPU, decoder="beam", beam=8,
                           workers=1, keep_pairs=5)

    ahead, reversed_ = run(batches), run(batches[::-1])
    rest = TIMINGS + ("loss",)
    assert without(ahead, rest) == without(reversed_, rest) and "cer_lo" in ahead and len(ahead["pairs"]) == 5
    assert ahead["loss"] == pytest.approx(reversed_["loss"], rel=1e-6)
