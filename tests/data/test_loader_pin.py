"""Pinned batches for a CUDA device: the readers' DataLoader pins on its thread, the loader
without readers pins in the caller's, and the values do not change. This CPU-only torch cannot
pin (no accelerator), so ``Tensor.pin_memory`` is replaced by a marking copy here."""
import pytest
import torch

from speechperf.data.loader import make_loader
from speechperf.data.loader_config import LoaderConfig

PINNED = set()


@pytest.fixture
def fake_pin(monkeypatch):
    """``Tensor.pin_memory`` as a copy whose storage is remembered as pinned."""
    def pin(t):
        out = t.clone()
        PINNED.add(out.untyped_storage().data_ptr())
        return out
    PINNED.clear()
    monkeypatch.setattr(torch.Tensor, "pin_memory", pin)
    return lambda t: t.untyped_storage().data_ptr() in PINNED


def batches(feats, **kw):
    cfg = LoaderConfig(batch_size=4, max_duration=0.0, readers=0)
    return list(make_loader(feats, ["train-clean", "train-other"], cfg, epoch=1, seed=3, **kw))


def test_a_pinning_loader_yields_the_same_batches_pinned(tiny_features, fake_pin):
    plain = batches(tiny_features)
    pinned = batches(tiny_features, pin_memory=True)
    assert len(plain) == len(pinned) > 1
    for a, b in zip(plain, pinned):
        for name in ("feats", "feat_lens", "labels", "label_lens"):
            assert torch.equal(getattr(a, name), getattr(b, name)), name
            assert fake_pin(getattr(b, name)) and not fake_pin(getattr(a, name)), name
        assert (a.ids, a.transcripts, a.audio_seconds, a.reads) == (b.ids, b.transcripts, b.audio_seconds, b.reads)


def test_the_readers_dataloader_pins_only_when_asked(tiny_features):
    cfg = LoaderConfig(batch_size=4, max_duration=0.0, readers=2)
    assert make_loader(tiny_features, ["train-clean", "train-other"], cfg, epoch=1, seed=3, pin_memory=True)._dataloader().pin_memory
    assert not make_loader(tiny_features, ["train-clean", "train-other"], cfg, epoch=1, seed=3)._dataloader().pin_memory
