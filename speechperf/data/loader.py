"""The training loader: parallel readers, shuffle, batch, pad, prefetch of whole batches.

Each epoch's batches are planned up front from the compact index (data/index.py), as a pure
function of (seed, epoch) (data/plan.py): resuming at batch k of an epoch plans the same
list and starts at k without reading the skipped batches.

Readers are torch DataLoader worker processes, each owning whole windows: the planned batches
come in runs cut from one bucketing window, and run j (counted from the batch the loader starts
at) is read by reader j mod R, which decompresses each of the window's shards once and builds
its batches in order, decompressing the shards a batch needs with several threads where the
plan leaves configured readers idle (:func:`reader_threads`). The DataLoader hands readers'
items over round robin; the loader puts them back in planned order (holding at most a few runs
of batches), so the training loop sees exactly the planned order whatever R is.
``prefetch_batches`` whole batches are buffered ahead of the training loop.
:meth:`Loader.start` starts the readers before the first batch is asked for: the training loop
starts the next epoch's during the evaluation, so the readers' start and first windows overlap
it instead of the next step. Every batch carries the shards decompressed to build it
(``Batch.reads``); the loader counts them (``Loader.shard_reads``).
"""
from __future__ import annotations

import ctypes
import math
import multiprocessing
import os
import signal
import sys
from collections import Counter, OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info
from torch.utils.data._utils import signal_handling
from torch.utils.data.dataloader import _MultiProcessingDataLoaderIter

from speechperf.cpus import usable_cpus
from speechperf.data import index as index_mod
from speechperf.data.loader_config import LoaderConfig
from speechperf.data.index import Index
from speechperf.data.plan import Plan, batch_frames, plan_epoch
from speechperf.data.units import Units, UnitsError, ctc_min_frames, load_units
from speechperf.features.shards import ShardError, read_rows
from speechperf.features.stats import read_stats


@dataclass
class Batch:
    """One batch, padded; lengths give the valid frames and labels of each utterance."""

    feats: torch.Tensor  # (B, T, F) float32, normalized when the loader normalizes
    feat_lens: torch.Tensor  # (B,) int64 valid frames
    labels: torch.Tensor  # (sum L,) int64 labels of the run's units (data/units.py), concatenated
    label_lens: torch.Tensor  # (B,) int64
    ids: list[str]
    transcripts: list[str]
    audio_seconds: float  # total audio in the batch
    reads: tuple = ()  # (shard key, bytes decompressed) of each shard its reader decompressed for it
    ctc_frames: torch.Tensor | None = None  # (B,) int64 CPU: the frames a CTC alignment of each label sequence
    # needs (its length plus one per repeated neighbour; data/units.py); None: units that never repeat (characters)

    def pin_memory(self) -> "Batch":
        """The batch with its tensors in page-locked memory (the DataLoader's pin thread calls
        this): a copy to a CUDA device from pageable memory is staged by the driver and, for
        batches larger than its staging buffer, waits for the stream's queued work, so the step
        that sends it would wait for the previous step; from pinned memory it is queued."""
        return replace(self, feats=self.feats.pin_memory(), feat_lens=self.feat_lens.pin_memory(),
                       labels=self.labels.pin_memory(), label_lens=self.label_lens.pin_memory())


def load_index(feats: Path, splits: list[str]) -> Index:
    """The compact index of ``splits`` (data/index.py)."""
    return index_mod.load(Path(feats), splits)


class _Reader:
    """Builds planned batches in one process, keeping the last ``bucket_window + 2`` shards
    decompressed (float16, as stored: each row is converted when it is batched); labels in ``units``."""

    def __init__(self, index: Index, feats_dir: Path, cfg: LoaderConfig, stats, units: Units):
        self.index, self.feats_dir, self.cfg, self.stats, self.units = index, feats_dir, cfg, stats, units
        self.cache: OrderedDict[int, tuple] = OrderedDict()
        self.reads: list[tuple[str, int]] = []  # decompressed since the last batch was built

    def _shard(self, s: int) -> tuple:
        if s not in self.cache:
            self._keep(s, self._read(s))
        self.cache.move_to_end(s)
        return self.cache[s]

    def _read(self, s: int) -> tuple:
        split, name = self.index.keys[s].split("/")
        return read_rows(self.feats_dir / split / f"{name}.npz", self.index.shas[s])

    def _keep(self, s: int, rows: tuple) -> None:
        self.cache[s] = rows
        self.reads.append((self.index.keys[s], rows[3]))
        while len(self.cache) > self.cfg.bucket_window + 2:
            self.cache.popitem(last=False)

    def _prefetch(self, utts: np.ndarray, threads: int) -> None:
        """Decompress the shards ``utts`` need and the cache lacks, ``threads`` at a time: a
        batch cut from a length-sorted window holds utterances of nearly every shard of it, so
        a reader's first batch waits for its whole window (bucket_window 128 holds the 8 h demo
        corpus: one window, one reader). File reads, SHA-256 and zlib's inflate release the GIL. Shards are
        kept in the order the batch first needs them (what the serial path reads and reports),
        the cached ones it needs first moved out of eviction's way; a batch that needs more
        shards than the cache holds is left to the serial path."""
        need = list(dict.fromkeys(self.index.shard[utts].tolist()))  # first-need order
        missing = [s for s in need if s not in self.cache]
        if threads < 2 or len(missing) < 2 or len(need) > self.cfg.bucket_window + 2:
            return
        for s in need:
            if s in self.cache:
                self.cache.move_to_end(s)
        with ThreadPoolExecutor(min(threads, len(missing))) as pool:
            for s, rows in zip(missing, pool.map(self._read, missing)):
                self._keep(s, rows)

    def _place(self, u: int, out: np.ndarray) -> None:
        """Utterance ``u``'s frames into ``out`` (T, F) float32, normalized as the loader
        normalizes: float16 -> float32 is exact, so (x - mean) / std computed into ``out`` is
        bit for bit the value of converting first, without the temporaries."""
        ix = self.index
        feats, offsets, ids, _ = self._shard(int(ix.shard[u]))
        o = int(ix.offset[u])
        if o + 1 >= len(offsets) or str(ids[o]) != ix.id(u) or offsets[o + 1] - offsets[o] != len(out):
            raise ShardError(f"shard {self.feats_dir / ix.keys[ix.shard[u]]}.npz disagrees with its index at "
                             f"row {o} ({ix.id(u)}): prepare the split again")
        rows = feats[offsets[o]: offsets[o + 1]]
        if self.stats is None:
            out[:] = rows
        else:
            np.subtract(rows, self.stats[0], out=out)
            np.divide(out, self.stats[1], out=out)

    def batch(self, utts: np.ndarray, threads: int = 1) -> Batch:
        """The padded batch of ``utts``, its missing shards decompressed ``threads`` at a time."""
        ix = self.index
        self._prefetch(utts, threads)
        lens = ix.frames[utts].tolist()
        dim = self._shard(int(ix.shard[utts[0]]))[0].shape[1]
        x = _zeros((len(lens), batch_frames(lens, self.cfg), dim))  # (B, T, F)
        xs = x.numpy()
        for b, u in enumerate(utts.tolist()):
            self._place(u, xs[b, : lens[b]])
        texts = [ix.transcript(int(u)) for u in utts]
        labels = [self.units.encode(t) for t in texts]
        reads, self.reads = tuple(self.reads), []
        flat, label_lens = torch.from_numpy(np.concatenate(labels)), torch.tensor([len(lab) for lab in labels])
        need = None if self.units.is_char else ctc_min_frames(flat, label_lens)  # host arithmetic
        return Batch(x, torch.tensor(lens, dtype=torch.int64), flat, label_lens,  # (sum L,) int64, (B,) int64
                     [ix.id(int(u)) for u in utts], texts, float(sum(ix.duration[utts].tolist())), reads, need)


def _zeros(shape: tuple[int, ...]) -> torch.Tensor:
    """A zero float32 tensor; in a reader process, made in shared memory (a fresh shared file
    reads as zeros), so handing it to the training process copies nothing (torch moves an
    unshared tensor into shared memory first: one more pass over every batch)."""
    if get_worker_info() is None:
        return torch.zeros(shape, dtype=torch.float32)
    storage = torch.UntypedStorage._new_shared(4 * math.prod(shape))
    return torch.tensor([], dtype=torch.float32).set_(storage, 0, shape)


def owners(plan: Plan, readers: int) -> np.ndarray:
    """The reader of each batch: runs of consecutive batches from one window go to readers in
    rotation (run j to reader j mod readers)."""
    if not len(plan):
        return np.zeros(0, dtype=np.int64)
    new_run = np.concatenate([[0], (plan.groups[1:] != plan.groups[:-1]).astype(np.int64)])
    return np.cumsum(new_run) % max(readers, 1)


def reader_threads(configured: int, in_use: int) -> int:
    """Threads each reader decompresses shards with: its share of the configured readers'
    processes (an epoch of fewer windows than readers leaves the others idle: 8 readers and
    one window, 8 threads), at most the machine's cores over the readers in use."""
    return max(1, min(configured, usable_cpus()) // max(in_use, 1))


class _Readers(IterableDataset):
    """What each DataLoader worker yields: (position in the plan, Batch) of the runs it owns, in
    order, each batch's missing shards decompressed ``threads`` at a time."""

    def __init__(self, plan: Plan, reader: _Reader, readers: int, threads: int):
        self.plan, self.reader, self.owner, self.threads = plan, reader, owners(plan, readers), threads

    def __iter__(self):
        info = get_worker_info()
        me = 0 if info is None else info.id
        for pos in np.flatnonzero(self.owner == me).tolist():
            yield pos, self.reader.batch(self.plan.batches[pos], self.threads)


class Loader:
    """An iterable of Batch for one rank's part of one epoch, in planned order; counts the
    shards its readers decompressed (``shard_reads``: key -> times, ``bytes_read``).
    ``threads``: each reader's decompression threads (None: :func:`reader_threads`; in-process, 1)."""

    def __init__(self, plan: Plan, reader: _Reader, cfg: LoaderConfig, generator: torch.Generator,
                 threads: int | None = None, pin_memory: bool = False):
        self.plan, self.reader, self.cfg, self.generator, self.threads = plan, reader, cfg, generator, threads
        self.pin_memory = pin_memory  # batches in page-locked memory (for a CUDA device), pinned off the main thread
        self.shard_reads: Counter[str] = Counter()
        self.shard_bytes: dict[str, int] = {}  # key -> bytes one decompression of it yields
        self.bytes_read = 0
        self._items = None  # the readers' DataLoader iterator once started (start)

    def start(self) -> "Loader":
        """Start the reader processes now: they fill the prefetch buffer while the caller does
        something else. The batches and their order are the same (the plan is a pure function
        of (seed, epoch) and the readers' seeds come from the loader's own generator)."""
        if self.cfg.readers and self._items is None:
            self._items = _start(self._dataloader())
        return self

    def close(self) -> None:
        """Stop the reader processes of a loader that will not be read further, started ahead or
        part-read: every exit path of the training loop closes its loaders (``with loader:``),
        so no reader outlives the epoch it was started for, and none is left for the interpreter's
        exit (there torch no longer stops them and multiprocessing waits for each: a reader that
        ignores SIGTERM kept a stopped run waiting forever)."""
        items, self._items = self._items, None
        if items is not None:
            _stop_readers(items)

    def __enter__(self) -> "Loader":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __len__(self) -> int:
        return len(self.plan)

    def __iter__(self):
        for batch in self._ordered():
            for key, size in batch.reads:
                self.shard_reads[key] += 1
                self.shard_bytes[key] = size
                self.bytes_read += size
            yield batch

    def decompression_ratio(self) -> float:
        """Bytes decompressed / bytes of the distinct shards' contents (1.0: each shard once)."""
        return self.bytes_read / max(1, sum(self.shard_bytes.values()))

    def _ordered(self):
        if self.cfg.readers == 0:
            for utts in self.plan.batches:
                batch = self.reader.batch(utts, self.reader_threads())
                yield batch.pin_memory() if self.pin_memory else batch
            return
        items = self._items if self._items is not None else _start(self._dataloader())
        self._items = items  # held while read: close() stops its readers when the epoch is abandoned
        pending, want = {}, 0  # readers' batches that arrived before their turn
        for pos, batch in items:
            pending[pos] = batch
            while want in pending:
                yield pending.pop(want)
                want += 1
        self._items = None  # read to its end: torch has stopped the readers
        if pending or want != len(self.plan):
            raise RuntimeError(f"the loader's readers delivered {want} of {len(self.plan)} batches in order")

    def readers_in_use(self) -> int:
        """Reader processes this epoch starts: the configured ones, fewer where the plan has fewer
        runs to hand out (0: batches built in the caller's process)."""
        if not self.cfg.readers:
            return 0
        return min(self.cfg.readers, max(1, int(owners(self.plan, self.cfg.readers).max(initial=0)) + 1))

    def reader_threads(self) -> int:
        """Each reader's decompression threads: as given, else :func:`reader_threads`'s share."""
        if self.threads is not None:
            return self.threads
        return reader_threads(self.cfg.readers, self.readers_in_use()) if self.cfg.readers else 1

    def _dataloader(self) -> "_ReaderPool":
        readers, threads = self.readers_in_use(), self.reader_threads()
        prefetch = max(1, -(-self.cfg.prefetch_batches // readers))  # per reader, rounded up
        # pin_memory: its thread calls Batch.pin_memory
        return _ReaderPool(_Readers(self.plan, self.reader, readers, threads), batch_size=None, num_workers=readers,
                           prefetch_factor=prefetch, generator=self.generator, pin_memory=self.pin_memory,
                           worker_init_fn=partial(_reader_init, os.getpid()))


def make_loader(feats: Path, splits: list[str] | str, cfg: LoaderConfig, epoch: int, seed: int,
                start_batch: int = 0, rank: int = 0, world: int = 1, index: Index | None = None,
                threads: int | None = None, pin_memory: bool = False, units: Units | None = None) -> Loader:
    """An iterable of Batch for this rank's part of ``epoch``, from batch ``start_batch`` on
    (``index``: the splits' compact index when the caller holds it already; ``threads``: each
    reader's decompression threads, None: the idle readers' share, :func:`reader_threads`;
    ``pin_memory``: batches in page-locked memory, for a CUDA device; ``units``: the labels' units
    when the caller holds them, else ``cfg.units`` read from ``feats``, never trained: a run trains
    BPE units before its first loader, data/units.py's ``ensure_units``)."""
    feats = Path(feats)
    splits = [splits] if isinstance(splits, str) else list(splits)
    index = index if index is not None else load_index(feats, splits)
    plan = plan_epoch(index, cfg, epoch, seed, rank, world).sliced(start_batch)
    stats = _stats(feats) if cfg.normalize else None
    units = units if units is not None else load_units(feats, cfg.units)
    if units.spec != cfg.units:
        raise UnitsError(f"loader.units={cfg.units!r}, but the loader was handed the units {units.spec!r}")
    return Loader(plan, _Reader(index, feats, cfg, stats, units), cfg, _readers_generator(seed, epoch, rank), threads,
                  pin_memory)


class _ReaderPool(DataLoader):
    """torch's DataLoader, its iterator known while it is being made (``building``): an error raised
    while its readers start (a second stop signal's, or torch's SIGCHLD handler's) cannot leave
    readers behind that no one stops (:func:`_start`)."""

    building: _MultiProcessingDataLoaderIter | None = None

    def _get_iterator(self) -> _MultiProcessingDataLoaderIter:
        self.check_worker_number_rationality()
        items = object.__new__(_MultiProcessingDataLoaderIter)
        self.building = items
        items.__init__(self)  # forks the readers
        return items


STOP_SIGNALS = {signal.SIGINT, signal.SIGTERM}


def _start(pool: _ReaderPool) -> _MultiProcessingDataLoaderIter:
    """``iter(pool)``: its readers forked with SIGINT and SIGTERM blocked, so that each starts with
    both blocked and ignores them before it unblocks them (:func:`_reader_init`); a signal sent to the
    whole group meanwhile waits in the reader and is discarded there. Unblocked, torch's worker sets
    its own SIGTERM handler first thing, which dies of a signal its parent did not send, and only
    then calls ``worker_init_fn``: a group SIGTERM in that gap killed the reader, and torch's SIGCHLD
    handler turned it into "DataLoader worker (pid N) is killed by signal: Terminated" inside the
    training process, which failed instead of stopping (issue 61: about half of such signals). This
    thread's own signals wait until the readers are started; the process's other threads take them
    meanwhile. An error raised while they start stops the readers already started: they ignore the
    SIGTERM with which multiprocessing ends them at the interpreter's exit and joins them, which waited
    for ever."""
    started = set(multiprocessing.active_children())
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        return iter(pool)
    except BaseException:
        new = [p for p in multiprocessing.active_children() if p not in started]
        if pool.building is not None:
            _stop_readers(pool.building, new)
        raise
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)


def _reader_init(parent: int, _worker_id: int) -> None:
    """A reader process ignores SIGTERM and SIGINT; the training process that owns it stops it
    (:meth:`Loader.close`), and the kernel kills it when that process is gone.

    Slurm's scancel, a terminal's Ctrl-C and ``kill -- -PGID`` signal every process of the
    group: a reader that died of it made torch's SIGCHLD handler raise "DataLoader worker
    killed" inside the training process, which then failed (once inside a checkpoint's
    torch.save: "unexpected pos") instead of stopping saved and recorded as interrupted. The reader
    was forked with both blocked (:func:`_start`): ignoring them discards one sent meanwhile, and only
    then are they unblocked. A reader
    that ignores SIGTERM outlives a parent SIGKILLed (or one whose exit waited on it) unless it is
    told otherwise: Linux's PR_SET_PDEATHSIG sends it SIGKILL when the thread that started it
    ends (the training loop's main thread: the process). ``parent``: that process's id, checked
    after the call, since a parent gone before it sends nothing."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:
        os._exit(0)


_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
READER_JOIN_S = 5.0  # how long close() waits for a killed reader to be reaped


def _stop_readers(items, started: list | None = None) -> None:
    """Stop a DataLoader iterator's readers now: killed, reaped, then torch's own shutdown of its
    queues and threads. Readers only read, so nothing of theirs needs saving; torch's shutdown alone
    waits up to 5 s for a reader still building a batch (a whole window's shards), then sends the
    SIGTERM readers ignore, and returns with the reader alive. Their pids leave torch's SIGCHLD watch
    first: these deaths are no reader failure. ``started``: the reader processes of an iterator whose
    start was cut short (:func:`_start`), not all of them in its list yet and their pids perhaps in
    torch's watch before it noted so."""
    workers = list(dict.fromkeys([*getattr(items, "_workers", ()), *(started or ())]))
    if getattr(items, "_worker_pids_set", False) or started is not None:
        try:
            signal_handling._remove_worker_pids(id(items))
        except ValueError:  # a start cut short before its pids were watched
            pass
        items._worker_pids_set = False
    for w in workers:
        if w.is_alive():
            w.kill()
    for w in workers:
        w.join(timeout=READER_JOIN_S)
    try:
        items._shutdown_workers()
    except AttributeError:  # a start cut short before its queues existed: its readers were all it had
        items._shutdown = True  # and its __del__ has nothing left to shut down


def _readers_generator(seed: int, epoch: int, rank: int) -> torch.Generator:
    """The generator a DataLoader draws its readers' base seed from when its iterator is made.
    Its own, a function of (seed, epoch, rank): drawn from torch's default generator, that
    number was taken before a mid-epoch checkpoint in an uninterrupted run and again after the
    restore in the resumed one, shifting every later dropout and SpecAugment draw."""
    (state,) = np.random.SeedSequence([seed, epoch, rank]).generate_state(1, np.uint64)
    return torch.Generator().manual_seed(int(state) >> 1)  # 63 bits: manual_seed takes a signed int64


def _stats(feats: Path):
    return read_stats(feats)
