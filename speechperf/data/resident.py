"""The training split resident on the training device after the first epoch (``loader.resident``).

A hardware benchmark times the hardware: after the first epoch the data have been read, and a
GPU step that waits for reader processes (their start, their first windows, their share of a
few host cores) measures the host. With ``loader.resident`` the first epoch streams as without
it (loader.py, on the clock) and keeps every decoded utterance in one buffer on the training
device (GPU memory; host memory for a CPU run): the features as stored (float16, one contiguous
``(frames, dims)`` tensor, utterance ``u`` at rows ``off[u]:off[u + 1]`` in index order) and the
encoded labels likewise (uint8 for characters, int16 for BPE units over 255 pieces). Later epochs
cut the same planned batches (data/plan.py, a pure function of (seed, epoch)) from it by index
on the device: no reader process, no decompression, no host-to-device copy per batch (each
epoch's plan crosses once). The cut normalizes as the
readers do, ``(x - mean) / std`` in float32 from the float16 values, so every batch is the
streaming loader's bit for bit; SpecAugment draws from the run's CPU RNG and the CPU lengths,
which are the same (train/step.py).

A run that starts after the first epoch (resumed in epoch 2 or later), or whose first epoch did
not see every utterance (resumed inside it; a data-parallel rank sees its share), reads the
missing utterances' shards once, when its next epoch's loader is made (on the clock).

Its memory is known before the run: :func:`needed_bytes` (frames x dims x 2 bytes, plus the
labels); :func:`check_fits` refuses a run (exit 2, before its folder exists) whose buffer exceeds
the device's free memory less ``RESERVE`` of its total.
"""
from __future__ import annotations

import json
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, fields, replace
from pathlib import Path

import numpy as np
import psutil
import torch

from speechperf.cpus import usable_cpus
from speechperf.data.index import Index
from speechperf.data.loader import Batch, Loader, _Reader
from speechperf.data.loader_config import SIDE_BY_SIDE
from speechperf.data.plan import Plan, batch_frames
from speechperf.data.units import Units, ctc_min_frames, load_units
from speechperf.errors import SpeechperfError
from speechperf.features.feature_config import FeatureConfig
from speechperf.features.shards import ShardError, read_rows
from speechperf.features.stats import read_stats

FEATURE_BYTES = 2  # float16: the shards' own dtype, converted to float32 only when a batch is cut
RESERVE = 0.25  # share of the device's total memory left beside the buffer: activations, the optimizer
# state made at the first step, the evaluation's kept batches, the allocator's fragmentation
GB = 1e9


class ResidentMemoryError(SpeechperfError):
    """The resident training split does not fit the device's free memory (exit 2)."""


def feature_dims(feats: Path) -> int:
    """Features per frame of the prepared folder (its features.json; the default config's without one)."""
    path = Path(feats) / "features.json"
    try:
        saved = json.loads(path.read_text()) if path.exists() else {}
    except (OSError, ValueError) as e:
        raise SpeechperfError(f"{path} cannot be read ({type(e).__name__}: {e}): prepare the features again") from e
    names = {f.name for f in fields(FeatureConfig)}
    return FeatureConfig(**{k: v for k, v in saved.items() if k in names}).dim


def label_dtype(units: Units | None) -> np.dtype:
    """The buffer's label type: uint8 for the 30 characters, int16 for BPE ids (data/units.py's MAX_BPE)."""
    return np.dtype(np.uint8 if units is None or units.num_classes <= 256 else np.int16)


def needed_bytes(index: Index, dims: int, units: Units | None = None) -> int:
    """Bytes of the buffer: every frame's ``dims`` float16 values, and the labels (at most two a
    transcript byte: a doubled letter gets a separator; a BPE piece holds a character or more,
    or a word's boundary alone), of :func:`label_dtype` (``units`` None: characters)."""
    return int(index.frames.astype(np.int64).sum()) * dims * FEATURE_BYTES + \
        2 * len(index.text_bytes) * label_dtype(units).itemsize


def free_bytes(device: torch.device) -> tuple[int, int]:
    """(free, total) bytes of ``device``: CUDA's free memory, or the host's available memory."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)  # the driver's: what torch caches after a warm-up is the step's own
    vm = psutil.virtual_memory()
    return vm.available, vm.total


def side_by_side() -> int:
    """Processes started together beside this one that each fill a buffer of the same memory, itself
    included (``train --seeds N --parallel K`` on a CPU: drive/seed_slots.py sets ``SIDE_BY_SIDE``
    for the seeds it starts at once); 1 where nothing says so."""
    try:
        return max(1, int(os.environ.get(SIDE_BY_SIDE, "1")))
    except ValueError:
        return 1


def check_fits(index: Index, dims: int, device: torch.device, copies: int = 1, units: Units | None = None) -> int:
    """The buffer's bytes, after refusing a run whose ``copies`` buffers (the processes on this
    host, for a CPU run), times the seeds started beside it (:func:`side_by_side`), exceed the
    device's free memory less ``RESERVE`` of its total: each seed of several side by side checking
    only its own buffer against the same free memory, all of them ran (2 x 9.4 MB against 15 MB)."""
    copies *= side_by_side()
    need = needed_bytes(index, dims, units)
    free, total = free_bytes(device)
    room = free - RESERVE * total
    if need * copies > room:
        each = f" ({copies} processes x {need / GB:.2f} GB)" if copies > 1 else ""
        raise ResidentMemoryError(
            f"loader.resident=true needs {need * copies / GB:.2f} GB{each} for the training split "
            f"({len(index):,} utterances, {int(index.frames.astype(np.int64).sum()):,} frames x {dims} float16), "
            f"more than {device}'s {free / GB:.2f} GB free less a {RESERVE:.0%} reserve of its {total / GB:.1f} GB "
            f"({max(room, 0) / GB:.2f} GB): set loader.resident=false to stream every epoch")
    return need


class Resident:
    """The buffer of one process's training split on ``device`` and what of it is filled; labels in
    ``units`` (None: ``cfg.units`` read from ``feats``, never trained)."""

    def __init__(self, index: Index, feats: Path, cfg, device: torch.device, dims: int, units: Units | None = None):
        self.index, self.feats_dir, self.cfg, self.device = index, Path(feats), cfg, torch.device(device)
        self.units = units if units is not None else load_units(feats, cfg.units)
        frames = index.frames.astype(np.int64)
        self.off = np.concatenate([[0], np.cumsum(frames)])  # (N + 1,) rows of each utterance
        self.feats = torch.empty((int(self.off[-1]), dims), dtype=torch.float16, device=self.device)
        self.have = np.zeros(len(index), dtype=bool)  # utterances whose frames are in the buffer
        self.off_d = torch.from_numpy(self.off[:-1]).to(self.device)
        self.frames_d = torch.from_numpy(frames).to(self.device)
        stats = read_stats(self.feats_dir) if cfg.normalize else None
        self.stats = None if stats is None else tuple(torch.from_numpy(s).to(self.device) for s in stats)
        self.labels = None  # (labels, their offsets on the device, their lengths on the host): _encode

    @property
    def full(self) -> bool:
        return bool(self.have.all())

    def loader(self, stream: Loader, first: bool):
        """The loader of ``stream``'s planned batches: ``stream`` itself keeping what it reads while
        the buffer is being filled by a ``first`` epoch, else cut from the buffer (completed first)."""
        if not self.full and first:
            stream.reader = _RawReader(stream.reader.index, stream.reader.feats_dir, stream.reader.cfg,
                                       stream.reader.stats, stream.reader.units)
            return Filling(self, stream)
        self.complete()
        self._encode()  # once, when the loader is made (during the evaluation, started ahead), not in a step
        return ResidentLoader(self, stream.plan)

    def put(self, utts: np.ndarray, raw: torch.Tensor) -> None:
        """``raw`` (sum of ``utts``' frames, dims) float16, the utterances' rows in order, into the buffer."""
        lens = self.index.frames[utts].astype(np.int64)
        rows = np.repeat(self.off[utts] - np.concatenate([[0], np.cumsum(lens)[:-1]]), lens) + np.arange(lens.sum())
        self.feats.index_copy_(0, torch.from_numpy(rows).to(self.device), raw.to(self.device, non_blocking=True))
        self.have[utts] = True

    def complete(self) -> None:
        """Read the shards of every utterance not in the buffer, several at a time (file reads,
        SHA-256 and inflate release the GIL), and put their rows in."""
        missing = np.flatnonzero(~self.have)
        if not len(missing):
            return
        ix, threads = self.index, max(1, usable_cpus())
        missing = missing[np.argsort(ix.shard[missing], kind="stable")]  # grouped by shard, index order within
        shards, starts = np.unique(ix.shard[missing], return_index=True)
        ends = np.append(starts[1:], len(missing))
        with ThreadPoolExecutor(threads) as pool:
            for a in range(0, len(shards), 2 * threads):  # a few shards decompressed at a time, not the split
                part = range(a, min(a + 2 * threads, len(shards)))
                for i, rows in zip(part, pool.map(self._read, shards[a: a + 2 * threads].tolist())):
                    utts = missing[starts[i]: ends[i]]
                    self.put(utts, torch.from_numpy(np.concatenate([self._rows(u, rows) for u in utts.tolist()])))

    def _read(self, s: int) -> tuple:
        split, name = self.index.keys[s].split("/")
        return read_rows(self.feats_dir / split / f"{name}.npz", self.index.shas[s])

    def _rows(self, u: int, shard: tuple) -> np.ndarray:
        """Utterance ``u``'s float16 rows of its decompressed ``shard``, checked against the index as
        the reader checks them."""
        feats, offsets, ids, _ = shard
        o = int(self.index.offset[u])
        if o + 1 >= len(offsets) or str(ids[o]) != self.index.id(u) or \
                offsets[o + 1] - offsets[o] != self.index.frames[u]:
            raise ShardError(f"shard {self.feats_dir / self.index.keys[self.index.shard[u]]}.npz disagrees with its "
                             f"index at row {o} ({self.index.id(u)}): prepare the split again")
        return feats[offsets[o]: offsets[o + 1]]

    def _encode(self) -> tuple:
        """Every transcript's labels, encoded once, when the first cut epoch's loader is made (on the
        clock, as the readers encode theirs): (labels of :func:`label_dtype`, offsets, lengths) on the
        device, lengths and the frames CTC needs (None for characters) on the host."""
        if self.labels is None:
            ix = self.index
            encoded = [self.units.encode(ix.transcript(u)) for u in range(len(ix))]
            lens = np.array([len(e) for e in encoded], dtype=np.int64)
            need = None if self.units.is_char else ctc_min_frames(np.concatenate(encoded), lens)  # (N,) host
            flat = torch.from_numpy(np.concatenate(encoded).astype(label_dtype(self.units))).to(self.device)
            on = [torch.from_numpy(a).to(self.device) for a in (np.cumsum(lens) - lens, lens)]
            self.labels = (flat, *on, lens, need)
        return self.labels

    def batch(self, utts: np.ndarray, utts_d: torch.Tensor) -> Batch:
        """The padded batch of ``utts`` (host) / ``utts_d`` (the same, on the device), as the streaming
        loader builds it: (B, T, dims) float32 normalized, zero padding; labels concatenated."""
        ix = self.index
        lens = ix.frames[utts].tolist()
        frames = batch_frames(lens, self.cfg)
        x = self._cut_host(utts, frames) if self.device.type == "cpu" else self._cut_device(utts_d, frames)
        flat, lab_off, lab_lens, host_lens, need = self._encode()
        ll = host_lens[utts]
        # position p of the concatenated labels belongs to the utterance whose span holds it
        ends = torch.cumsum(lab_lens[utts_d], 0)
        p = torch.arange(int(ll.sum()), device=self.device)
        owner = torch.searchsorted(ends, p, right=True)
        labels = flat[lab_off[utts_d][owner] + p - (ends - lab_lens[utts_d])[owner]].long()
        return Batch(x, torch.tensor(lens, dtype=torch.int64), labels, torch.from_numpy(ll.copy()),
                     [ix.id(int(u)) for u in utts], [ix.transcript(int(u)) for u in utts],
                     float(sum(ix.duration[utts].tolist())), (),
                     None if need is None else torch.from_numpy(need[utts].copy()))


    def _cut_device(self, utts_d: torch.Tensor, frames: int) -> torch.Tensor:
        """(B, frames, dims) float32 gathered on the device in a few kernels, nothing read on the host."""
        t = torch.arange(frames, device=self.device)
        src = (self.off_d[utts_d][:, None] + t[None, :]).clamp_(max=self.feats.shape[0] - 1)  # (B, T) buffer rows
        x = self.feats[src].float()  # (B, T, dims): float16 -> float32 is exact
        if self.stats is not None:  # (x - mean) / std in float32: the readers' arithmetic
            x.sub_(self.stats[0]).div_(self.stats[1])
        return x.masked_fill_((t[None, :] >= self.frames_d[utts_d][:, None])[:, :, None], 0.0)  # padding: zeros

    def _cut_host(self, utts: np.ndarray, frames: int) -> torch.Tensor:
        """The same in host memory, one utterance at a time into a zeroed batch, as the readers
        place theirs: one pass over the values (the gather's temporaries cost 3x the time on a CPU)."""
        x = torch.zeros((len(utts), frames, self.feats.shape[1]), dtype=torch.float32)
        xs, buf = x.numpy(), self.feats.numpy()
        stats = None if self.stats is None else tuple(s.numpy() for s in self.stats)
        for b, u in enumerate(utts.tolist()):
            out = xs[b, : self.off[u + 1] - self.off[u]]
            if stats is None:
                out[:] = buf[self.off[u]: self.off[u + 1]]
            else:
                np.subtract(buf[self.off[u]: self.off[u + 1]], stats[0], out=out)
                np.divide(out, stats[1], out=out)
        return x


class _Closes:
    """``with loader:`` as with a :class:`Loader`: every exit path of the loop closes it."""

    def close(self) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class ResidentLoader(_Closes):
    """One epoch's planned batches cut from the buffer: a Loader without readers (``start`` and
    ``close`` do nothing; no shard is read). The plan's utterances cross to the device once."""

    def __init__(self, resident: Resident, plan: Plan):
        self.resident, self.plan = resident, plan
        self.bounds = np.cumsum([0] + [len(b) for b in plan.batches])
        flat = np.concatenate(plan.batches) if len(plan) else np.zeros(0, dtype=np.int64)
        self.utts_d = torch.from_numpy(flat.astype(np.int64)).to(resident.device)

    def start(self) -> "ResidentLoader":
        return self

    def __len__(self) -> int:
        return len(self.plan)

    def readers_in_use(self) -> int:
        return 0

    def __iter__(self):
        for i, utts in enumerate(self.plan.batches):
            yield self.resident.batch(utts, self.utts_d[self.bounds[i]: self.bounds[i + 1]])


class Filling(_Closes):
    """The streaming loader of a first epoch, each batch's float16 rows put into the buffer as it
    arrives (its readers ship them beside the batch: :class:`_RawReader`)."""

    def __init__(self, resident: Resident, stream: Loader):
        self.resident, self.stream, self.plan = resident, stream, stream.plan

    def start(self) -> "Filling":
        self.stream.start()
        return self

    def close(self) -> None:
        self.stream.close()

    def __len__(self) -> int:
        return len(self.stream)

    def readers_in_use(self) -> int:
        return self.stream.readers_in_use()

    def __iter__(self):
        for utts, batch in zip(self.plan.batches, self.stream):
            self.resident.put(utts, batch.raw)
            yield Batch(*(getattr(batch, f.name) for f in fields(Batch)))  # without its raw rows


@dataclass
class RawBatch(Batch):
    """A streamed batch with its utterances' rows as stored (float16, concatenated in batch order)."""

    raw: torch.Tensor | None = None

    def pin_memory(self) -> "RawBatch":
        return replace(super().pin_memory(), raw=self.raw.pin_memory())


class _RawReader(_Reader):
    """The loader's reader, also keeping each utterance's float16 rows as it places them."""

    def _place(self, u: int, out: np.ndarray) -> None:
        super()._place(u, out)
        feats, offsets, _, _ = self.cache[int(self.index.shard[u])]  # just used: in the cache
        o = int(self.index.offset[u])
        self.rows.append(feats[offsets[o]: offsets[o + 1]])

    def batch(self, utts: np.ndarray, threads: int = 1) -> RawBatch:
        self.rows = []
        b = super().batch(utts, threads)
        raw = torch.from_numpy(np.concatenate(self.rows))
        self.rows = []
        return RawBatch(*(getattr(b, f.name) for f in fields(Batch)), raw=raw)
