"""``speechperf prepare CORPUS FEATS`` (or ``prepare FEATS --manifest SPLIT=PATH``, lhotse
manifests: corpus/manifests.py): features of every split into shards, once.

Parallel over CPU worker processes (one spawn pool for every split, one shard per task,
one torch thread per worker), resumable (a shard whose ``.json`` exists is done and
skipped; a SIGKILLed run's workers die with it), with memory bounded by a shard, not the
corpus (the scan streams into the pool, index.json is written one sidecar at a time;
benchmarks/run.py prepare), and honest about input: every file that cannot be
used is reported with its name and reason in ``FEATS/prepare.json``, the rest is prepared.
A split already prepared is checked, not trusted: every shard is hashed against the index,
and those missing or damaged (and an unreadable index) are rebuilt and named, so re-running
prepare is the repair the loader's checksum error advises.
Also writes ``FEATS/features.json`` (the FeatureConfig, and under ``made_with`` the
arithmetic, torch, numpy and MKL versions and the ISA cap variables it was made under) and ``FEATS/stats.json``
(per-dimension mean and std over the train-* splits, for normalization): once, never
changed by a later call (a repair keeps it) unless ``recompute_stats`` asks; see
features/stats.py.
"""
from __future__ import annotations

import ctypes
import dataclasses
import itertools
import json
import multiprocessing as mp
import os
import re
import signal
import sys
import time
from collections import Counter
from importlib import metadata
from pathlib import Path

import numpy as np
from tqdm import tqdm

from speechperf.atomic import remove_leftovers
from speechperf.corpus.librispeech import (AudioError, Problem, Utterance, find_splits, is_train_split, iter_split,
                                          read_audio)
from speechperf.corpus.manifests import SplitManifests, split_manifests
from speechperf.errors import SpeechperfError
from speechperf.features.feature_config import FeatureConfig
from speechperf.features.index_stream import write_index
from speechperf.features.shards import (ShardError, as_stored, file_sha256, load_index, shard_name, write_json,
                                        write_shard)
from speechperf.features.stats import refuse_change, write_stats


def prepare(corpus: Path | None, out: Path, splits: list[str] | None = None, workers: int = 0, progress: bool = True,
            config: FeatureConfig = FeatureConfig(), recompute_stats: bool = False,
            manifests: list[tuple[str, Path]] | None = None) -> dict:
    """Prepare (or complete) ``out`` from ``corpus`` (the LibriSpeech layout) or from
    ``manifests`` ((split, lhotse manifest) pairs, corpus/manifests.py); returns {"splits": rows}.
    ``stats.json`` is kept as it is unless ``recompute_stats`` (a new training split is refused
    without it)."""
    out = Path(out)
    sources = _sources(corpus, splits, manifests)  # before any file is written
    _check_config(out, config)
    refuse_change(out, [s.split for s in sources if is_train_split(s.split)], recompute_stats)  # before any work
    rows, sums, problems, t0 = [], {}, {}, time.perf_counter()
    remove_leftovers(out)  # a killed run's half-written stats.json or prepare.json
    with _Workers(workers or os.cpu_count() or 1) as pool:
        for source in sources:
            row, sums[source.split], problems[source.split] = _prepare_split(source, out, pool, progress, config)
            rows.append(row)
    write_stats(out, _prepared_train_splits(out), recompute_stats, sums)
    rebuilt = {r["split"]: r.pop("rebuilt") for r in rows if r.get("rebuilt")}
    write_json(out / "prepare.json", {"corpus": None if corpus is None else str(corpus),
                                      "manifests": _manifest_record(out, sources),
                                      "seconds": time.perf_counter() - t0, "splits": rows,
                                      "problems": problems, "rebuilt": rebuilt})
    if progress:
        for split, probs in problems.items():
            for p in probs[:20]:
                print(f"{split}: {p['kind']}: {p['message']}")
            if len(probs) > 20:
                print(f"{split}: ... {len(probs) - 20} more problems in {out / 'prepare.json'}")
    return {"splits": rows}


class _LibriSpeechSplit:
    """A split of a LibriSpeech-layout corpus, as manifests.SplitManifests is one of manifests."""

    def __init__(self, corpus: Path, split: str):
        self.corpus, self.split = corpus, split

    def utterances(self, problems: list[Problem]):
        """The split a chapter at a time: the parent never holds it (960 h: 281,241 utterances)."""
        return iter_split(self.corpus, self.split, problems)

    def estimate(self) -> int:
        """Utterances if every transcript line is usable (an upper bound, for the progress bar)."""
        lines = 0
        for trans in (self.corpus / self.split).glob("*/*/*.trans.txt"):
            with open(trans, encoding="utf-8", errors="replace") as f:
                lines += sum(1 for line in f if line.strip())
        return lines


def _sources(corpus: Path | None, splits: list[str] | None, manifests: list[tuple[str, Path]] | None) -> list:
    """What each split is read from: the corpus's folders, or the manifests (never both)."""
    if manifests:
        if corpus is not None or splits:
            raise SpeechperfError("prepare reads either a corpus folder (CORPUS, --splits) or lhotse manifests "
                                  "(--manifest SPLIT=PATH), not both")
        return split_manifests(manifests)
    if corpus is None:
        raise SpeechperfError("prepare needs a corpus folder (CORPUS) or lhotse manifests (--manifest SPLIT=PATH)")
    corpus = Path(corpus)
    splits = splits or find_splits(corpus)
    if not splits:
        raise SpeechperfError(f"no split with *.trans.txt files under {corpus}")
    return [_LibriSpeechSplit(corpus, split) for split in splits]


def _manifest_record(out: Path, sources: list) -> dict:
    """prepare.json's {split: [manifest files]}: this call's, and those an earlier call recorded
    for other splits (the repair command of each split names its own manifests)."""
    try:
        record = json.loads((out / "prepare.json").read_text()).get("manifests") or {}
    except (OSError, ValueError, AttributeError):
        record = {}
    record = {k: v for k, v in record.items() if k not in {s.split for s in sources}}
    return {**record, **{s.split: [str(p) for p in s.files] for s in sources if isinstance(s, SplitManifests)}}


def _check_config(out: Path, config: FeatureConfig) -> None:
    path = out / "features.json"
    wanted = dataclasses.asdict(config)
    if path.exists():
        # a field added since the folder was made reads as its default (compress: such folders are deflated)
        have = {**dataclasses.asdict(FeatureConfig()), **json.loads(path.read_text())}
        have.pop(MADE_WITH, None)
        if have != wanted:
            raise SpeechperfError(f"{out} holds features made with another FeatureConfig ({have}); use a new folder")
    else:
        out.mkdir(parents=True, exist_ok=True)
        write_json(path, {**wanted, MADE_WITH: made_with()})


MADE_WITH = "made_with"  # features.json's record of what computed the features (not part of the FeatureConfig)
PRECISION = "float64"  # the arithmetic of features/extract.py, recorded in made_with
CAP_VARS = ("ONEDNN_MAX_CPU_ISA", "ATEN_CPU_CAPABILITY", "MKL_CBWR")  # hardware/isa_cap.py's variables


def made_with() -> dict:
    """What computes this process's features: {"precision", "torch", "numpy", "mkl", "cap"}
    (the cap: the ISA cap's variables as set, {} when none)."""
    import torch  # heavy: the index and damage checks run without it

    mkl = re.search(r"Math Kernel Library Version ([^\n]+?) for", torch.__config__.show())
    return {"precision": PRECISION, "torch": metadata.version("torch"), "numpy": np.__version__,
            "mkl": mkl.group(1).strip() if mkl else None,
            "cap": {var: os.environ[var] for var in CAP_VARS if os.environ.get(var)}}


def _prepare_split(source, out, pool: "_Workers", progress, config) -> tuple[dict, dict | None, list[dict]]:
    """(row, feature sums, problems) of ``split``, prepared or completed (a finished and intact
    split is only read). Memory is bounded by a shard, not the split: the scan streams into
    the pool (see _Shards) and the index is written one sidecar at a time (index_stream.py)."""
    split = source.split
    split_dir = out / split
    rebuilt, index = _damaged(split_dir)
    if index is not None:  # finished and intact: read once (98 MB of JSON at 960 h), not again
        seconds = sum(r["duration"] for r in index["utterances"])
        return (_row(split, len(index["utterances"]), seconds, len(index["shards"]), index["problems"]),
                index["sums"], index["problems"])
    split_dir.mkdir(parents=True, exist_ok=True)
    remove_leftovers(split_dir)  # a killed run's half-written shard, sidecar or index
    shards = _Shards(source, split_dir, config)
    todo = shards.todo()
    first = next(todo, None)  # a split whose shards are all done (killed while indexing) starts no pool
    if first is not None:
        total = shards.estimate() - sum(1 for _ in split_dir.glob("shard-*.json")) if progress else None
        for _ in tqdm(pool.imap(itertools.chain([first], todo)), total=total,
                      desc=f"prepare {split}", unit="shard", disable=not progress):
            pass
    summary = write_index(split_dir, split, shards.count, [p.to_dict() for p in shards.problems])  # last
    row = _row(split, summary["kept"], summary["seconds"], len(summary["shards"]), summary["problems"])
    return {**row, **({"rebuilt": rebuilt} if rebuilt else {})}, summary["sums"], summary["problems"]


class _Workers:
    """One spawn pool for every split (a pool per split paid the workers' start, torch's import,
    once per split), started at the first shard to make: a finished folder starts none."""

    def __init__(self, n: int):
        self.n, self.pool = n, None

    def __enter__(self) -> "_Workers":
        return self

    def __exit__(self, *exc) -> None:
        if self.pool is not None:
            self.pool.terminate()

    def imap(self, tasks):
        """Results of ``_shard_task`` over ``tasks`` as they finish; ``tasks`` is consumed lazily
        by the pool's feeder thread, held back by the pipe to the workers."""
        if self.pool is None:
            ctx = mp.get_context("spawn")  # no fork after torch threads exist
            self.pool = ctx.Pool(self.n, initializer=_worker_init, initargs=(os.getpid(),))
        return self.pool.imap_unordered(_shard_task, tasks)


class _Shards:
    """A split's shards as tasks, made while the pool works: the corpus is scanned a chapter
    (a manifest line) at a time, so the parent never holds the split's utterances (960 h:
    281,241). ``count`` and ``problems`` are complete once ``todo()`` is exhausted."""

    def __init__(self, source, split_dir: Path, config: FeatureConfig):
        self.source, self.split_dir, self.config = source, split_dir, config
        self.count, self.problems = 0, []

    def todo(self):
        """(split_dir, k, utterances, config) of every shard k without a sidecar, in order."""
        utts = self.source.utterances(self.problems)
        while chunk := list(itertools.islice(utts, self.config.utts_per_shard)):
            k, self.count = self.count, self.count + 1
            if not (self.split_dir / f"{shard_name(k)}.json").exists():
                yield self.split_dir, k, chunk, self.config

    def estimate(self) -> int:
        """Shards if every utterance is usable (an upper bound, for the progress bar)."""
        return -(-self.source.estimate() // self.config.utts_per_shard)


def _worker_init(parent: int) -> None:
    """A worker: one torch thread (W workers on W cores, not W x cores threads fighting), and
    on Linux killed with its parent: a SIGKILLed prepare leaves no orphan finishing a shard
    beside the rerun's, or waiting forever on the task pipe (its write end is inherited too)."""
    import torch  # heavy: the index and damage checks run without it

    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # 1: PR_SET_PDEATHSIG
        if os.getppid() != parent:  # the parent died before prctl took effect
            os._exit(1)
    torch.set_num_threads(1)


def _damaged(split_dir: Path) -> tuple[list[str], dict | None]:
    """([], the index) if ``split_dir`` is complete and every shard matches the index;
    otherwise (the damaged files, None): they are named on stderr and removed, with their
    sidecars and the index, so the normal path rebuilds exactly those shards (a kill meanwhile
    leaves the split unfinished)."""
    path = split_dir / "index.json"
    if not path.exists():
        return [], None  # never finished: the normal (resumable) path
    try:
        index = load_index(split_dir)
        shards = index["shards"]
        bad = [name for name, sha in sorted(shards.items()) if file_sha256(split_dir / f"{name}.npz") != sha]
        damaged = [f"{split_dir / name}.npz" for name in bad]
    except (ShardError, KeyError, TypeError, AttributeError):
        bad, damaged = [], [str(path)]  # the index itself: rebuilt from the sidecars
    if not damaged:
        return [], index
    for item in damaged:
        print(f"prepare: {item} is missing or does not match its checksum; rebuilding it", file=sys.stderr)
    path.unlink()  # first: from here on the split reads as unfinished
    for name in bad:
        (split_dir / f"{name}.json").unlink(missing_ok=True)
        (split_dir / f"{name}.npz").unlink(missing_ok=True)
    return damaged, None


def _shard_task(task) -> str:
    """Worker: read, check, extract and write one shard, then its sidecar."""
    from speechperf.features.extract import extract_batch, frame_count  # loads torch (see made_with)

    split_dir, k, utts, cfg = task
    kept: list[tuple[Utterance, np.ndarray]] = []
    problems: list[dict] = []
    for u in utts:
        try:
            audio = read_audio(u.audio_path, cfg.sample_rate, u.start, u.samples, u.channel)
        except AudioError as e:  # a manifest's cut named beside its file: a file may hold many cuts
            problems.append(Problem(e.path, e.kind, f"{u.cut}: {e}" if u.cut else str(e)).to_dict())
            continue
        seconds = len(audio) / cfg.sample_rate
        if seconds > cfg.max_seconds:
            problems.append(Problem(u.audio_path, "too_long",
                                    f"{u.where}: {seconds:.2f} s > {cfg.max_seconds} s").to_dict())
        elif frame_count(len(audio), cfg) < cfg.min_frames:
            problems.append(Problem(u.audio_path, "too_short",
                                    f"{u.where}: {frame_count(len(audio), cfg)} frames < {cfg.min_frames}").to_dict())
        else:
            kept.append((u, audio))
    feats = extract_batch([a for _, a in kept], cfg) if kept else []
    name = shard_name(k)
    records, sha, sums = [], None, None
    if kept:
        sha = write_shard(split_dir / f"{name}.npz", feats, [u.id for u, _ in kept], [u.transcript for u, _ in kept],
                          [len(a) / cfg.sample_rate for _, a in kept], compress=cfg.compress)
        records = [{"id": u.id, "shard": name, "offset": i, "frames": int(len(f)), "duration": len(a) / cfg.sample_rate,
                    "transcript": u.transcript, "speaker": u.speaker} for i, ((u, a), f) in enumerate(zip(kept, feats))]
        # the sums of the stored values: one ulp of a float32 value that float16 rounds away
        # leaves them as they are
        stacked = as_stored(np.concatenate(feats)).astype(np.float64)  # (sum T, dim)
        sums = {"n": int(len(stacked)), "sum": stacked.sum(0).tolist(), "sumsq": (stacked**2).sum(0).tolist()}
    write_json(split_dir / f"{name}.json", {"shard": name, "sha256": sha, "records": records, "problems": problems,
                                            "sums": sums})
    return name


def _prepared_train_splits(out: Path) -> list[str]:
    """Every training split of ``out`` whose index is complete: what the statistics cover."""
    return sorted(p.name for p in out.iterdir()
                  if p.is_dir() and is_train_split(p.name) and (p / "index.json").exists())


def _row(split: str, kept: int, seconds: float, shards: int, problems: list[dict]) -> dict:
    kinds = Counter(p["kind"] for p in problems)
    return {"split": split, "kept": kept, "dropped": sum(kinds.values()),
            "hours": round(seconds / 3600, 4), "shards": shards,
            "problems": ", ".join(f"{k}={v}" for k, v in sorted(kinds.items())) or "-"}
