"""``speechperf prepare CORPUS FEATS``: features of every split into shards, once.

Parallel over CPU worker processes (one shard per task), resumable (a shard whose
``.json`` exists is done and skipped), and honest about input: every file that cannot be
used is reported with its name and reason in ``FEATS/prepare.json``, the rest is prepared.
A split already prepared is checked, not trusted: every shard is hashed against the index,
and those missing or damaged (and an unreadable index) are rebuilt and named, so re-running
prepare is the repair the loader's checksum error advises.
Also writes ``FEATS/features.json`` (the FeatureConfig) and ``FEATS/stats.json``
(per-dimension mean and std over the train-* splits, for normalization): once, never
changed by a later call (a repair keeps it) unless ``recompute_stats`` asks; see
features/stats.py.
"""
from __future__ import annotations

import dataclasses
import json
import multiprocessing as mp
import os
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np

from speechperf.corpus.librispeech import (AudioError, Problem, Utterance, find_splits, is_train_split, read_audio,
                                          scan_split)
from speechperf.errors import SpeechperfError
from speechperf.features.config import FeatureConfig
from speechperf.features.shards import ShardError, file_sha256, load_index, shard_name, write_json, write_shard
from speechperf.features.stats import refuse_change, write_stats


def prepare(corpus: Path, out: Path, splits: list[str] | None = None, workers: int = 0, progress: bool = True,
            config: FeatureConfig = FeatureConfig(), recompute_stats: bool = False) -> dict:
    """Prepare (or complete) ``out`` from ``corpus``; returns {"splits": rows}. ``stats.json``
    is kept as it is unless ``recompute_stats`` (a new training split is refused without it)."""
    corpus, out = Path(corpus), Path(out)
    _check_config(out, config)
    splits = splits or find_splits(corpus)
    if not splits:
        raise SpeechperfError(f"no split with *.trans.txt files under {corpus}")
    refuse_change(out, [s for s in splits if is_train_split(s)], recompute_stats)  # before any work
    rows, t0 = [], time.perf_counter()
    for split in splits:
        rows.append(_prepare_split(corpus, out, split, workers or os.cpu_count() or 1, progress, config))
    write_stats(out, _prepared_train_splits(out), recompute_stats)
    problems = {r["split"]: load_index(out / r["split"])["problems"] for r in rows}
    rebuilt = {r["split"]: r.pop("rebuilt") for r in rows if r.get("rebuilt")}
    write_json(out / "prepare.json", {"corpus": str(corpus), "seconds": time.perf_counter() - t0, "splits": rows,
                                      "problems": problems, "rebuilt": rebuilt})
    if progress:
        for split, probs in problems.items():
            for p in probs[:20]:
                print(f"{split}: {p['kind']}: {p['message']}")
            if len(probs) > 20:
                print(f"{split}: ... {len(probs) - 20} more problems in {out / 'prepare.json'}")
    return {"splits": rows}


def _check_config(out: Path, config: FeatureConfig) -> None:
    path = out / "features.json"
    wanted = dataclasses.asdict(config)
    if path.exists():
        have = json.loads(path.read_text())
        if have != wanted:
            raise SpeechperfError(f"{out} holds features made with another FeatureConfig ({have}); use a new folder")
    else:
        out.mkdir(parents=True, exist_ok=True)
        write_json(path, wanted)


def _prepare_split(corpus, out, split, workers, progress, config) -> dict:
    from tqdm import tqdm

    split_dir = out / split
    rebuilt = _damaged(split_dir)
    if rebuilt is None:
        return _row(load_index(split_dir))
    scan = scan_split(corpus, split)
    n = config.utts_per_shard
    tasks = [(split_dir, k, scan.utterances[i: i + n], config) for k, i in enumerate(range(0, len(scan.utterances), n))]
    todo = [t for t in tasks if not (split_dir / f"{shard_name(t[1])}.json").exists()]
    split_dir.mkdir(parents=True, exist_ok=True)
    if todo:
        ctx = mp.get_context("spawn")  # no fork after torch threads exist
        with ctx.Pool(min(workers, len(todo))) as pool:
            for _ in tqdm(pool.imap_unordered(_shard_task, todo), total=len(todo), desc=f"prepare {split}",
                          unit="shard", disable=not progress):
                pass
    metas = [json.loads((split_dir / f"{shard_name(t[1])}.json").read_text()) for t in tasks]
    index = {"split": split, "utterances": [r for m in metas for r in m["records"]],
             "shards": {m["shard"]: m["sha256"] for m in metas if m["records"]},
             "problems": [p.to_dict() for p in scan.problems] + [p for m in metas for p in m["problems"]],
             "sums": _add_sums([m["sums"] for m in metas])}
    write_json(split_dir / "index.json", index)  # last: the split is complete
    return {**_row(index), **({"rebuilt": rebuilt} if rebuilt else {})}


def _damaged(split_dir: Path) -> list[str] | None:
    """None if ``split_dir`` is complete and every shard matches the index; otherwise the
    damaged files (named on stderr), with them, their sidecars and the index removed so the
    normal path rebuilds exactly those shards (a kill meanwhile leaves the split unfinished)."""
    path = split_dir / "index.json"
    if not path.exists():
        return []  # never finished: the normal (resumable) path
    try:
        index = load_index(split_dir)
        shards = index["shards"]
        bad = [name for name, sha in sorted(shards.items()) if file_sha256(split_dir / f"{name}.npz") != sha]
        damaged = [f"{split_dir / name}.npz" for name in bad]
    except (ShardError, KeyError, TypeError, AttributeError):
        bad, damaged = [], [str(path)]  # the index itself: rebuilt from the sidecars
    if not damaged:
        return None
    for item in damaged:
        print(f"prepare: {item} is missing or does not match its checksum; rebuilding it", file=sys.stderr)
    path.unlink()  # first: from here on the split reads as unfinished
    for name in bad:
        (split_dir / f"{name}.json").unlink(missing_ok=True)
        (split_dir / f"{name}.npz").unlink(missing_ok=True)
    return damaged


def _shard_task(task) -> str:
    """Worker: read, check, extract and write one shard, then its sidecar."""
    import torch

    from speechperf.features.extract import extract_batch, frame_count

    torch.set_num_threads(1)
    split_dir, k, utts, cfg = task
    kept: list[tuple[Utterance, np.ndarray]] = []
    problems: list[dict] = []
    for u in utts:
        try:
            audio = read_audio(u.audio_path, cfg.sample_rate)
        except AudioError as e:
            problems.append(Problem(e.path, e.kind, str(e)).to_dict())
            continue
        seconds = len(audio) / cfg.sample_rate
        if seconds > cfg.max_seconds:
            problems.append(Problem(u.audio_path, "too_long", f"{u.audio_path}: {seconds:.2f} s > {cfg.max_seconds} s").to_dict())
        elif frame_count(len(audio), cfg) < cfg.min_frames:
            problems.append(Problem(u.audio_path, "too_short",
                                    f"{u.audio_path}: {frame_count(len(audio), cfg)} frames < {cfg.min_frames}").to_dict())
        else:
            kept.append((u, audio))
    feats = extract_batch([a for _, a in kept], cfg) if kept else []
    name = shard_name(k)
    records, sha, sums = [], None, None
    if kept:
        sha = write_shard(split_dir / f"{name}.npz", feats, [u.id for u, _ in kept], [u.transcript for u, _ in kept],
                          [len(a) / cfg.sample_rate for _, a in kept])
        records = [{"id": u.id, "shard": name, "offset": i, "frames": int(len(f)), "duration": len(a) / cfg.sample_rate,
                    "transcript": u.transcript, "speaker": u.speaker} for i, ((u, a), f) in enumerate(zip(kept, feats))]
        stacked = np.concatenate(feats).astype(np.float64)
        sums = {"n": int(len(stacked)), "sum": stacked.sum(0).tolist(), "sumsq": (stacked**2).sum(0).tolist()}
    write_json(split_dir / f"{name}.json", {"shard": name, "sha256": sha, "records": records, "problems": problems,
                                            "sums": sums})
    return name


def _add_sums(parts: list[dict | None]) -> dict | None:
    parts = [p for p in parts if p]
    if not parts:
        return None
    return {"n": sum(p["n"] for p in parts), "sum": np.sum([p["sum"] for p in parts], 0).tolist(),
            "sumsq": np.sum([p["sumsq"] for p in parts], 0).tolist()}


def _prepared_train_splits(out: Path) -> list[str]:
    """Every training split of ``out`` whose index is complete: what the statistics cover."""
    return sorted(p.name for p in out.iterdir() if p.is_dir() and is_train_split(p.name) and (p / "index.json").exists())


def _row(index: dict) -> dict:
    kinds = Counter(p["kind"] for p in index["problems"])
    hours = sum(r["duration"] for r in index["utterances"]) / 3600
    return {"split": index["split"], "kept": len(index["utterances"]), "dropped": sum(kinds.values()),
            "hours": round(hours, 4), "shards": len(index["shards"]),
            "problems": ", ".join(f"{k}={v}" for k, v in sorted(kinds.items())) or "-"}
