from collections import Counter

import pytest
import torch

from speechperf.corpus import alphabet
from speechperf.data.config import LoaderConfig
from speechperf.data.loader import load_records, make_loader, plan_epoch

SPLITS = ["train-clean", "train-other"]


def ids_of(batches):
    return [r["id"] for b in batches for r in b]


def test_every_utterance_once_and_deterministic(tiny_features):
    records, _ = load_records(tiny_features, SPLITS)
    cfg = LoaderConfig(batch_size=5)
    e1 = plan_epoch(records, cfg, epoch=1, seed=3)
    assert Counter(ids_of(e1)) == Counter(r["id"] for r in records)
    assert ids_of(e1) == ids_of(plan_epoch(records, cfg, epoch=1, seed=3))
    assert ids_of(e1) != ids_of(plan_epoch(records, cfg, epoch=2, seed=3))
    assert ids_of(e1) != ids_of(plan_epoch(records, cfg, epoch=1, seed=4))


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


def test_normalization_uses_train_statistics(tiny_features):
    xs = [b.feats[i, : b.feat_lens[i]] for b in make_loader(tiny_features, SPLITS, LoaderConfig(batch_size=8), 1, 0)
          for i in range(len(b.ids))]
    cat = torch.cat(xs)
    assert cat.mean(0).abs().max() < 0.05 and (cat.std(0) - 1).abs().max() < 0.05


@pytest.mark.parametrize("world", [2, 3])
def test_rank_slices_disjoint_and_equal_length(tiny_features, world):
    records, _ = load_records(tiny_features, SPLITS)
    cfg = LoaderConfig(batch_size=6)
    parts = [plan_epoch(records, cfg, 1, 5, rank=r, world=world) for r in range(world)]
    assert len({len(p) for p in parts}) == 1
    seen = [i for p in parts for i in ids_of(p)]
    assert len(seen) == len(set(seen))
    whole = plan_epoch(records, cfg, 1, 5)
    assert sum(len(b) for b in whole if len(b) >= world) == len(seen)
