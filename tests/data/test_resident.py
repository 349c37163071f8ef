"""loader.resident: the first epoch streams and fills a buffer on the training device; later
epochs cut the streaming loader's batches from it, bit for bit, with no reader process."""
import dataclasses

import numpy as np
import psutil
import pytest
import torch

from speechperf.data import resident as resident_mod
from speechperf.data.loader import load_index, make_loader
from speechperf.data.loader_config import LoaderConfig
from speechperf.data.resident import Filling, Resident, ResidentLoader, ResidentMemoryError, check_fits, \
    feature_dims, needed_bytes

SPLITS = ["train-clean", "train-other"]
CONFIGS = [
    LoaderConfig(batch_size=5, readers=1, prefetch_batches=2),
    LoaderConfig(batch_size=4, readers=2, prefetch_batches=4, balance=True),
    LoaderConfig(max_duration=30.0, readers=0),
    LoaderConfig(batch_size=6, readers=0, mode="pad", pad_frames=900, normalize=False),
]


def stream(feats, cfg, epoch, start=0, ix=None):
    return make_loader(feats, SPLITS, cfg, epoch=epoch, seed=5, start_batch=start, index=ix)


def assert_same(got, want):
    got, want = list(got), list(want)
    assert len(got) == len(want) > 0
    for a, b in zip(got, want):
        for f in dataclasses.fields(b):
            x, y = getattr(a, f.name), getattr(b, f.name)
            if f.name == "reads":
                continue  # the shards a reader decompressed for it: none for a cut batch
            if isinstance(y, torch.Tensor):
                assert x.dtype == y.dtype and x.shape == y.shape and torch.equal(x.cpu(), y), f.name
            else:
                assert x == y, f.name


def filled(feats, cfg, ix):
    res = Resident(ix, feats, cfg, torch.device("cpu"), feature_dims(feats))
    first = res.loader(stream(feats, cfg, 1, ix=ix), first=True)
    assert isinstance(first, Filling)
    assert_same(first, stream(feats, cfg, 1, ix=ix))  # the first epoch is the streaming loader's
    assert res.full
    return res


@pytest.mark.parametrize("cfg", CONFIGS, ids=["full", "balanced-2-readers", "duration", "pad-raw"])
def test_epochs_after_the_first_are_the_streaming_batches_bit_for_bit(tiny_features, cfg):
    ix = load_index(tiny_features, SPLITS)
    res = filled(tiny_features, cfg, ix)
    for epoch in (2, 3):
        cut = res.loader(stream(tiny_features, cfg, epoch, ix=ix), first=False)
        assert isinstance(cut, ResidentLoader) and cut.readers_in_use() == 0
        assert_same(cut, stream(tiny_features, cfg, epoch, ix=ix))


def test_no_reader_process_after_the_first_epoch(tiny_features):
    cfg = CONFIGS[0]
    ix = load_index(tiny_features, SPLITS)
    res = filled(tiny_features, cfg, ix)
    me = psutil.Process()
    before = {p.pid for p in me.children()}  # the first epoch's readers may still be exiting
    loader = res.loader(stream(tiny_features, cfg, 2, ix=ix), first=False).start()
    for _ in loader:
        assert {p.pid for p in me.children()} <= before


@pytest.mark.parametrize("epoch,start", [(2, 0), (2, 3), (3, 7)])
def test_a_run_resumed_after_the_first_epoch_reads_the_split_once_and_cuts_the_same_batches(tiny_features, epoch,
                                                                                           start):
    cfg = CONFIGS[0]
    ix = load_index(tiny_features, SPLITS)
    res = Resident(ix, tiny_features, cfg, torch.device("cpu"), feature_dims(tiny_features))
    cut = res.loader(stream(tiny_features, cfg, epoch, start, ix=ix), first=False)
    assert res.full  # read when the loader was made
    assert_same(cut, stream(tiny_features, cfg, epoch, start, ix=ix))
    assert_same(res.loader(stream(tiny_features, cfg, epoch + 1, ix=ix), first=False),
                stream(tiny_features, cfg, epoch + 1, ix=ix))


def test_a_run_resumed_inside_the_first_epoch_completes_the_buffer_after_it(tiny_features):
    cfg = CONFIGS[0]
    ix = load_index(tiny_features, SPLITS)
    res = Resident(ix, tiny_features, cfg, torch.device("cpu"), feature_dims(tiny_features))
    resumed = res.loader(stream(tiny_features, cfg, 1, 4, ix=ix), first=True)
    assert_same(resumed, stream(tiny_features, cfg, 1, 4, ix=ix))
    assert not res.full  # the first four batches' utterances were never streamed
    assert_same(res.loader(stream(tiny_features, cfg, 2, ix=ix), first=False), stream(tiny_features, cfg, 2, ix=ix))


def test_the_memory_needed_is_the_buffer_and_a_run_that_does_not_fit_is_refused(tiny_features, monkeypatch):
    cfg = CONFIGS[0]
    ix = load_index(tiny_features, SPLITS)
    res = filled(tiny_features, cfg, ix)
    labels = res._encode()[0]
    need = needed_bytes(ix, 93)
    assert res.feats.nelement() * 2 <= need <= res.feats.nelement() * 2 + 2 * labels.nelement()
    assert check_fits(ix, 93, torch.device("cpu")) == need
    monkeypatch.setattr(resident_mod, "free_bytes", lambda device: (need + 10**6, 10 * need))
    with pytest.raises(ResidentMemoryError, match=r"needs 0\.\d\d GB .* more than cpu's 0\.\d\d GB free less a 25% "
                                                  r"reserve .*: set loader.resident=false"):
        check_fits(ix, 93, torch.device("cpu"))
    monkeypatch.setattr(resident_mod, "free_bytes", lambda device: (3 * need, 3 * need))
    check_fits(ix, 93, torch.device("cpu"), copies=2)
    with pytest.raises(ResidentMemoryError, match=r"\(3 processes x "):
        check_fits(ix, 93, torch.device("cpu"), copies=3)


def test_the_field_is_validated():
    assert LoaderConfig(resident=True).problems() == []
    assert LoaderConfig(resident="yes").problems() == ["loader.resident='yes' must be true or false"]


def test_every_frame_lands_where_the_index_says(tiny_features):
    ix = load_index(tiny_features, SPLITS)
    res = filled(tiny_features, LoaderConfig(batch_size=7, readers=0, normalize=False), ix)
    u = int(np.argmax(ix.frames))
    batch = res.batch(np.array([u]), torch.tensor([u]))
    assert torch.equal(batch.feats[0], res.feats[res.off[u]: res.off[u + 1]].float())


@pytest.mark.parametrize("cfg", [CONFIGS[0], CONFIGS[3]], ids=["normalized", "pad-raw"])
def test_the_device_cut_equals_the_host_cut(tiny_features, cfg):
    """A CUDA device's cut (one gather, no host read) run here on the CPU: the host cut's values."""
    ix = load_index(tiny_features, SPLITS)
    res = filled(tiny_features, cfg, ix)
    for utts in stream(tiny_features, cfg, 2, ix=ix).plan.batches:
        frames = max(int(ix.frames[utts].max()), cfg.pad_frames if cfg.mode == "pad" else 0)
        got, want = res._cut_device(torch.from_numpy(utts.astype(np.int64)), frames), res._cut_host(utts, frames)
        assert got.dtype == want.dtype and torch.equal(got, want)


@pytest.mark.cuda
def test_on_a_cuda_device_the_batches_are_the_streaming_ones(tiny_features):
    cfg = CONFIGS[2]
    ix = load_index(tiny_features, SPLITS)
    res = Resident(ix, tiny_features, cfg, torch.device("cuda"), feature_dims(tiny_features))
    assert_same(res.loader(stream(tiny_features, cfg, 1, ix=ix), first=True), stream(tiny_features, cfg, 1, ix=ix))
    cut = list(res.loader(stream(tiny_features, cfg, 2, ix=ix), first=False))
    assert all(b.feats.is_cuda and b.labels.is_cuda and not b.feat_lens.is_cuda for b in cut)
    assert_same(cut, stream(tiny_features, cfg, 2, ix=ix))


def test_seeds_started_side_by_side_count_every_buffer(tiny_features, monkeypatch):
    """Issue 61: ``train --seeds N --parallel K`` on a CPU: each seed's check counts the buffers of the
    seeds started with it (drive/seed_slots.py says how many), not only its own."""
    from speechperf.data.loader_config import SIDE_BY_SIDE

    ix = load_index(tiny_features, SPLITS)
    need = needed_bytes(ix, 93)
    monkeypatch.setattr(resident_mod, "free_bytes", lambda device: (int(1.6 * need), int(1.6 * need)))  # 1.2 x room
    assert check_fits(ix, 93, torch.device("cpu")) == need  # alone it fits
    monkeypatch.setenv(SIDE_BY_SIDE, "2")
    with pytest.raises(ResidentMemoryError, match=r"\(2 processes x "):
        check_fits(ix, 93, torch.device("cpu"))
