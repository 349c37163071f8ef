import threading
from collections import Counter
from dataclasses import replace

import pytest
import torch

from speechperf.corpus import alphabet
from speechperf.data.loader_config import LoaderConfig
from speechperf.data import loader as loader_mod
from speechperf.data.loader import load_index, make_loader
from speechperf.data.plan import plan_epoch
from speechperf import cpus

SPLITS = ["train-clean", "train-other"]


def ids_of(plan, ix):
    return [ix.id(int(u)) for b in plan.batches for u in b]


def test_every_utterance_once_and_deterministic(tiny_features):
    ix = load_index(tiny_features, SPLITS)
    cfg = LoaderConfig(batch_size=5)
    e1 = plan_epoch(ix, cfg, epoch=1, seed=3)
    assert Counter(ids_of(e1, ix)) == Counter(ix.id(i) for i in range(len(ix)))
    assert ids_of(e1, ix) == ids_of(plan_epoch(ix, cfg, epoch=1, seed=3), ix)
    assert ids_of(e1, ix) != ids_of(plan_epoch(ix, cfg, epoch=2, seed=3), ix)
    assert ids_of(e1, ix) != ids_of(plan_epoch(ix, cfg, epoch=1, seed=4), ix)


def test_start_batch_equals_slicing_and_readers_agree(tiny_features):
    cfg = LoaderConfig(batch_size=4, readers=0)
    full = [b.ids for b in make_loader(tiny_features, SPLITS, cfg, epoch=2, seed=1)]
    tail = [b.ids for b in make_loader(tiny_features, SPLITS, cfg, epoch=2, seed=1, start_batch=3)]
    assert tail == full[3:]
    par = [b.ids for b in make_loader(tiny_features, SPLITS, LoaderConfig(batch_size=4, readers=2, prefetch_batches=4),
                                      epoch=2, seed=1)]
    assert par == full


def test_readers_leave_the_run_s_random_stream_alone(tiny_features):
    """Iterating a loader with reader processes takes no number from torch's default generator
    (dropout's and SpecAugment's): a run resumed inside an epoch makes its loader after the
    RNG restore, the uninterrupted run before the checkpoint, and both must draw alike."""
    cfg = LoaderConfig(batch_size=4, readers=1, prefetch_batches=2)
    torch.manual_seed(7)
    before = torch.get_rng_state()
    for _ in make_loader(tiny_features, SPLITS, cfg, epoch=1, seed=1, start_batch=20):
        pass
    assert torch.equal(torch.get_rng_state(), before)


def test_batch_contents(tiny_features):
    for b in make_loader(tiny_features, "dev-clean", LoaderConfig(batch_size=3), epoch=1, seed=0):
        assert b.feats.shape[0] == len(b.ids) == len(b.transcripts) and b.feats.shape[2] == 93
        assert b.feats.shape[1] == int(b.feat_lens.max())
        assert int(b.label_lens.sum()) == len(b.labels)
        labels = torch.split(b.labels, b.label_lens.tolist())
        assert [alphabet.decode(lab.tolist()) for lab in labels] == b.transcripts  # round trip
        assert b.audio_seconds > 0


def test_pad_mode_pads_to_1670_and_bucket_pads_less(tiny_features):
    pad = list(make_loader(tiny_features, SPLITS, LoaderConfig(batch_size=6, mode="pad"), epoch=1, seed=0))
    assert all(b.feats.shape[1] == 1670 for b in pad)
    bucket = list(make_loader(tiny_features, SPLITS, LoaderConfig(batch_size=6), epoch=1, seed=0))
    frames = lambda bs: sum(b.feats.shape[0] * b.feats.shape[1] for b in bs)  # noqa: E731
    assert frames(bucket) < frames(pad) / 2


def test_pad_multiple_rounds_each_batch_up_with_zero_frames_and_keeps_the_plan(tiny_features):
    """loader.pad_multiple: the same batches, each padded to a multiple of its frames (fewer distinct
    shapes), the extra frames zero and past every length."""
    plain = list(make_loader(tiny_features, SPLITS, LoaderConfig(batch_size=6, readers=0), epoch=2, seed=0))
    rounded = list(make_loader(tiny_features, SPLITS, LoaderConfig(batch_size=6, readers=0, pad_multiple=32), 2, 0))
    assert [b.ids for b in rounded] == [b.ids for b in plain]
    for a, b in zip(plain, rounded):
        t = a.feats.shape[1]
        assert b.feats.shape[1] == -(-t // 32) * 32 and torch.equal(b.feat_lens, a.feat_lens)
        assert torch.equal(b.feats[:, :t], a.feats) and not b.feats[:, t:].any()
    assert LoaderConfig(pad_multiple=0).problems() == ["loader.pad_multiple=0 must be >= 1 (1: no rounding)"]


def test_normalization_uses_train_statistics(tiny_features):
    xs = [b.feats[i, : b.feat_lens[i]] for b in make_loader(tiny_features, SPLITS, LoaderConfig(batch_size=8), 1, 0)
          for i in range(len(b.ids))]
    cat = torch.cat(xs)
    assert cat.mean(0).abs().max() < 0.05 and (cat.std(0) - 1).abs().max() < 0.05


@pytest.mark.parametrize("world", [2, 3])
def test_rank_slices_disjoint_and_equal_length(tiny_features, world):
    ix = load_index(tiny_features, SPLITS)
    cfg = LoaderConfig(batch_size=6)
    parts = [plan_epoch(ix, cfg, 1, 5, rank=r, world=world) for r in range(world)]
    assert len({len(p) for p in parts}) == 1
    seen = [i for p in parts for i in ids_of(p, ix)]
    assert len(seen) == len(set(seen))
    whole = plan_epoch(ix, cfg, 1, 5)
    assert sum(len(b) for b in whole.batches if len(b) >= world) == len(seen)


DURATION = LoaderConfig(max_duration=12.0, bucket_window=2, readers=0)


@pytest.mark.parametrize("cfg", [LoaderConfig(batch_size=4, bucket_window=2), DURATION], ids=["fixed", "duration"])
@pytest.mark.parametrize("readers", [1, 2, 4])
def test_readers_decompress_each_shard_once_in_planned_order(tiny_features, cfg, readers):
    """With R readers each shard is decompressed once per epoch (counted by the loader from
    what its readers report), and the training loop sees the planned order."""
    serial = make_loader(tiny_features, SPLITS, replace(cfg, readers=0), epoch=2, seed=1)
    want = [b.ids for b in serial]
    loader = make_loader(tiny_features, SPLITS, replace(cfg, readers=readers, prefetch_batches=4), epoch=2, seed=1)
    assert [b.ids for b in loader] == want
    ix = load_index(tiny_features, SPLITS)
    assert set(loader.shard_reads) == {ix.keys[s] for s in set(ix.shard.tolist())}
    assert max(loader.shard_reads.values()) == 1 and loader.decompression_ratio() == 1.0
    assert serial.decompression_ratio() == 1.0


def test_duration_resume_mid_epoch_is_the_tail(tiny_features):
    full = [b.ids for b in make_loader(tiny_features, SPLITS, DURATION, epoch=3, seed=2)]
    assert len(full) > 4 and len({len(i) for i in full}) > 1  # batches of varying sizes
    for start in (1, len(full) // 2):
        tail = make_loader(tiny_features, SPLITS, replace(DURATION, readers=2), epoch=3, seed=2, start_batch=start)
        assert [b.ids for b in tail] == full[start:]
    secs = [b.audio_seconds for b in make_loader(tiny_features, SPLITS, DURATION, epoch=3, seed=2)]
    assert max(secs) <= 12.0


def test_a_loader_started_ahead_yields_the_same_batches_and_close_stops_its_readers(tiny_features):
    """Loader.start (the next epoch's readers started during the evaluation) changes nothing in
    the batches, their order or the run's random stream; close stops the readers of a started
    loader that is never read."""
    cfg = LoaderConfig(batch_size=4, readers=2, prefetch_batches=4)
    plain = [(b.ids, b.feats) for b in make_loader(tiny_features, SPLITS, cfg, epoch=3, seed=2)]
    torch.manual_seed(7)
    before = torch.get_rng_state()
    ahead = make_loader(tiny_features, SPLITS, cfg, epoch=3, seed=2).start()
    assert torch.equal(torch.get_rng_state(), before)
    got = [(b.ids, b.feats) for b in ahead]
    assert [i for i, _ in got] == [i for i, _ in plain]
    assert all(torch.equal(a, b) for (_, a), (_, b) in zip(got, plain))
    unread = make_loader(tiny_features, SPLITS, cfg, epoch=4, seed=2).start()
    workers = list(unread._items._workers)
    assert workers and all(w.is_alive() for w in workers)
    unread.close()
    assert not any(w.is_alive() for w in workers)
    unread.close()  # twice: nothing left to stop


ALL = ["dev-clean", "dev-other", "test-clean", "test-other", "train-clean", "train-other"]  # 6 shards


@pytest.mark.parametrize("cfg", [replace(DURATION, max_duration=40.0),
                                 replace(DURATION, max_duration=20.0, bucket_window=1, sort_first_epoch=True)],
                         ids=["windows", "sorted-over-the-cache"])
def test_threaded_decompression_builds_the_same_batches_and_reads(tiny_features, cfg, monkeypatch):
    """Each batch's missing shards decompressed by several threads: the same batches, bit for
    bit, and the same shards decompressed in the same order as one at a time, also where a
    batch needs more shards than the reader's cache holds (SortaGrad's sorted epoch with a
    window of 1 keeps 3: those batches are left to the serial path)."""
    ix = load_index(tiny_features, ALL)
    spans = [len(set(ix.shard[b].tolist())) for b in plan_epoch(ix, cfg, 1, 2).batches]
    assert max(spans) > 1 and (max(spans) > cfg.bucket_window + 2) == cfg.sort_first_epoch

    def epoch(threads):
        loader = make_loader(tiny_features, ALL, cfg, epoch=1, seed=2, threads=threads)
        return [(b.ids, b.feats, b.reads) for b in loader]
    serial = epoch(1)
    pooled = []  # shards read off the main thread: by the pool
    read = loader_mod._Reader._read
    monkeypatch.setattr(loader_mod._Reader, "_read", lambda self, s: (
        pooled.append(s) if threading.current_thread() is not threading.main_thread() else None, read(self, s))[1])
    threaded = epoch(3)
    assert [(i, r) for i, _, r in threaded] == [(i, r) for i, _, r in serial]
    assert all(torch.equal(a, b) for (_, a, _), (_, b, _) in zip(threaded, serial))
    assert pooled and sum(len(r) for _, _, r in serial) >= len(ix.keys)


def test_readers_given_threads_agree_with_the_serial_loader(tiny_features):
    """Reader processes with decompression threads (the loader's choice and an explicit count)
    yield the serial in-process loader's batches and read each shard once."""
    want = [b.ids for b in make_loader(tiny_features, SPLITS, DURATION, epoch=2, seed=1)]
    for threads in (None, 4):
        loader = make_loader(tiny_features, SPLITS, replace(DURATION, readers=2, prefetch_batches=4), epoch=2,
                             seed=1, threads=threads)
        assert [b.ids for b in loader] == want
        assert loader.decompression_ratio() == 1.0


@pytest.mark.parametrize("configured, in_use, cores, want", [(8, 1, 16, 8), (8, 2, 16, 4), (8, 3, 16, 2), (8, 8, 16, 1),
                                                              (32, 1, 16, 16), (8, 1, 2, 2), (8, 2, 2, 1), (1, 1, 16, 1)])
def test_reader_threads_are_the_idle_readers_share_within_the_cores(monkeypatch, configured, in_use, cores, want):
    monkeypatch.setattr(cpus.os, "sched_getaffinity", lambda _pid: set(range(cores)), raising=False)
    assert loader_mod.reader_threads(configured, in_use) == want
