"""The training loader: parallel readers, shuffle, batch, pad, prefetch of whole batches.

Each epoch's batches are planned up front from the split indexes, as a pure function of
(seed, epoch): resuming at batch k of an epoch plans the same list and starts at k
without reading the skipped batches. Planning keeps shard locality: shards are shuffled,
then taken ``bucket_window`` at a time; within a window utterances are sorted by length
and cut into batches (``bucket`` mode, little padding) or kept in shuffled order and
padded to ``pad_frames`` (``pad`` mode, the paper's), and the window's batches are
shuffled. Readers are torch DataLoader worker processes; ``prefetch_batches`` whole
batches are buffered ahead of the training loop.

With ``world`` ranks, every planned batch of ``batch_size`` utterances is split evenly:
rank r takes utterances r, r + world, ... so all ranks run the same number of steps
(DDP never waits on a rank without data); a final batch smaller than ``world`` is dropped.
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from speechperf.corpus import alphabet
from speechperf.data.config import LoaderConfig
from speechperf.errors import SpeechperfError
from speechperf.features.shards import load_index, read_shard
from speechperf.features.stats import read_stats


@dataclass
class Batch:
    """One batch, padded; lengths give the valid frames and labels of each utterance."""

    feats: torch.Tensor  # (B, T, F) float32, normalized when the loader normalizes
    feat_lens: torch.Tensor  # (B,) int64 valid frames
    labels: torch.Tensor  # (sum L,) int64 alphabet indices, concatenated
    label_lens: torch.Tensor  # (B,) int64
    ids: list[str]
    transcripts: list[str]
    audio_seconds: float  # total audio in the batch


def plan_epoch(records: list[dict], cfg: LoaderConfig, epoch: int, seed: int, rank: int = 0,
               world: int = 1) -> list[list[dict]]:
    """This rank's batches of ``epoch``: lists of index records, deterministic for (seed, epoch)."""
    rng = np.random.default_rng([seed, epoch])
    if world < 1 or not 0 <= rank < world:
        raise SpeechperfError(f"rank {rank} of world {world} is invalid")
    by_shard: dict[str, list[dict]] = {}
    for r in records:
        by_shard.setdefault(r["key"], []).append(r)
    shards = sorted(by_shard)
    if cfg.shuffle:
        shards = [shards[i] for i in rng.permutation(len(shards))]
    if cfg.sort_first_epoch and epoch == 1:  # SortaGrad: short utterances first
        return _split_ranks(_cut(sorted(records, key=lambda r: (r["frames"], r["id"])), cfg.batch_size), rank, world)
    batches: list[list[dict]] = []
    for w in range(0, len(shards), cfg.bucket_window):
        window = [r for s in shards[w: w + cfg.bucket_window] for r in by_shard[s]]
        if cfg.mode == "bucket" or not cfg.shuffle:
            window.sort(key=lambda r: (r["frames"], r["id"]))
        elif cfg.shuffle:
            window = [window[i] for i in rng.permutation(len(window))]
        cut = _cut(window, cfg.batch_size)
        if cfg.shuffle:
            cut = [cut[i] for i in rng.permutation(len(cut))]
        batches += cut
    return _split_ranks(batches, rank, world)


def _cut(items: list[dict], size: int) -> list[list[dict]]:
    return [items[i: i + size] for i in range(0, len(items), size)]


def _split_ranks(batches: list[list[dict]], rank: int, world: int) -> list[list[dict]]:
    if world == 1:
        return batches
    return [b[rank::world] for b in batches if len(b) >= world]


class _BatchDataset(Dataset):
    """Map-style dataset whose item i is the i-th planned batch (a reader loads it whole)."""

    def __init__(self, batches, feats_dir: Path, shas: dict, cfg: LoaderConfig, stats):
        self.batches, self.feats_dir, self.shas, self.cfg, self.stats = batches, feats_dir, shas, cfg, stats
        self.cache: OrderedDict[str, dict] = OrderedDict()  # decompressed shards, per reader process

    def __len__(self) -> int:
        return len(self.batches)

    def _shard(self, key: str) -> dict:
        if key not in self.cache:
            split, name = key.split("/")
            self.cache[key] = read_shard(self.feats_dir / split / f"{name}.npz", self.shas[key])
            while len(self.cache) > self.cfg.bucket_window + 2:
                self.cache.popitem(last=False)
        self.cache.move_to_end(key)
        return self.cache[key]

    def __getitem__(self, i: int) -> Batch:
        recs = self.batches[i]
        feats = [self._shard(r["key"])[r["id"]][0] for r in recs]
        if self.stats is not None:
            mean, std = self.stats
            feats = [(f - mean) / std for f in feats]
        lens = [len(f) for f in feats]
        width = max(max(lens), self.cfg.pad_frames) if self.cfg.mode == "pad" else max(lens)
        x = np.zeros((len(feats), width, feats[0].shape[1]), dtype=np.float32)  # (B, T, F)
        for b, f in enumerate(feats):
            x[b, : len(f)] = f
        labels = [alphabet.encode(r["transcript"]) for r in recs]
        return Batch(torch.from_numpy(x), torch.tensor(lens, dtype=torch.int64),
                     torch.tensor([c for lab in labels for c in lab], dtype=torch.int64),
                     torch.tensor([len(lab) for lab in labels], dtype=torch.int64),
                     [r["id"] for r in recs], [r["transcript"] for r in recs], float(sum(r["duration"] for r in recs)))


def load_records(feats: Path, splits: list[str]) -> tuple[list[dict], dict]:
    """Index records of ``splits`` (each with a shard key ``split/shard``) and shard checksums."""
    records, shas = [], {}
    for split in splits:
        index = load_index(Path(feats) / split)
        for r in index["utterances"]:
            records.append({**r, "key": f"{split}/{r['shard']}"})
        shas.update({f"{split}/{name}": sha for name, sha in index["shards"].items()})
    if not records:
        raise SpeechperfError(f"no utterances in {', '.join(splits)} under {feats}")
    return records, shas


def make_loader(feats: Path, splits: list[str] | str, cfg: LoaderConfig, epoch: int, seed: int,
                start_batch: int = 0, rank: int = 0, world: int = 1):
    """An iterable of Batch for this rank's part of ``epoch``, from batch ``start_batch`` on."""
    feats = Path(feats)
    splits = [splits] if isinstance(splits, str) else list(splits)
    records, shas = load_records(feats, splits)
    batches = plan_epoch(records, cfg, epoch, seed, rank, world)[start_batch:]
    stats = _stats(feats) if cfg.normalize else None
    dataset = _BatchDataset(batches, feats, shas, cfg, stats)
    if cfg.readers == 0:
        return dataset
    prefetch = max(1, -(-cfg.prefetch_batches // cfg.readers))  # per reader, rounded up
    return DataLoader(dataset, batch_size=None, shuffle=False, num_workers=cfg.readers, prefetch_factor=prefetch,
                      generator=_readers_generator(seed, epoch, rank),
                      worker_init_fn=_reader_ignores_stop_signals if cfg.readers else None)


def _reader_ignores_stop_signals(_worker_id: int) -> None:
    """A reader process ignores SIGTERM and SIGINT; the training process that owns it stops it.

    Slurm's scancel, a terminal's Ctrl-C and ``kill -- -PGID`` signal every process of the
    group: a reader that died of it made torch's SIGCHLD handler raise "DataLoader worker
    killed" inside the training process, which then failed (once inside a checkpoint's
    torch.save: "unexpected pos") instead of stopping saved and recorded as interrupted."""
    import signal

    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _readers_generator(seed: int, epoch: int, rank: int) -> torch.Generator:
    """The generator a DataLoader draws its readers' base seed from when its iterator is made.
    Its own, a function of (seed, epoch, rank): drawn from torch's default generator, that
    number was taken before a mid-epoch checkpoint in an uninterrupted run and again after the
    restore in the resumed one, shifting every later dropout and SpecAugment draw."""
    (state,) = np.random.SeedSequence([seed, epoch, rank]).generate_state(1, np.uint64)
    return torch.Generator().manual_seed(int(state) >> 1)  # 63 bits: manual_seed takes a signed int64


def _stats(feats: Path):
    return read_stats(feats)
