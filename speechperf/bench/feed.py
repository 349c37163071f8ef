"""How many CPU cores feed one GPU: the GPU's appetite against the loader's supply per reader.

Appetite: audio seconds per second of the preset's training step (``train.step.train_step``:
planned forward, CTC in fp32, backward, clip, masked optimizer step) on batches already on
the device, ``loader.batch_size`` utterances each at LibriSpeech's lengths (most 10-17 s,
mean ~12.3 s). Measured where the device is a GPU (or ``device="cpu"`` asks for this CPU);
otherwise read from a recorded profile (``config/gpu_appetite.toml``) and named as such.

Supply: audio seconds per second the real loader (``data.loader``: reader processes,
decompression, normalization, padding, the hand-over) delivers over prepared shards, divided
by its readers: the rate one reader process (one core) sustains. Without ``data`` a shard set
at LibriSpeech lengths is written to a temporary folder with the package's shard writer. The
supply is timed over whole loader windows: a reader decompresses all of a bucketing window's
shards for the window's first batch and builds the rest from them, so a span of a few batches
times either that work or batches already built (measured on 2 cores, 4-batch spans of the
`gpu` preset alternated about 3,200 and 12,000 audio s/s, and their median read 2x the
sustained rate).

Both are timed in windows (warm-up first, CUDA synchronized at each window's ends); the
figures are the windows' median and their spread ((max - min) / median).
"""
from __future__ import annotations

import math
import os
import statistics
import tempfile
import time
import tomllib
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from speechperf.children import sigterm_stops
from speechperf.config import load_preset
from speechperf.corpus.sentences import SentenceGenerator
from speechperf.data.batching import Batching
from speechperf.data.loader import Batch, load_index, make_loader
from speechperf.data.units import Units, ensure_units
from speechperf.errors import SpeechperfError
from speechperf.features.feature_config import FeatureConfig
from speechperf.features.shards import shard_name, write_json, write_shard
from speechperf.models import build_model, fp8
from speechperf.models.contract import compiled
from speechperf.train.distributed import DistEnv, pick_device
from speechperf.train.step import make_optimizer, train_step
from speechperf.train.warmup import check_precision
from speechperf.train.auto_precision import settled

PROFILES = Path(__file__).resolve().parents[1] / "config" / "gpu_appetite.toml"
FRAME_S = 0.01  # 10 ms hop (features/feature_config.py)
CHARS_PER_S = 15.0  # LibriSpeech read speech: about 15 characters (spaces included) per second
SHARD_UTTS = 64  # utterances per synthetic shard (a prepared split's order of size)
SUPPLY_BATCH = 64  # utterances per supply batch at most: the rate is per audio second, a bigger batch
# only lengthens the windows (and the synthetic set the windows need)
LENGTHS_APART = 0.25  # the supply's and the appetite's mean utterance lengths apart by more: said under the table
SYNTHETIC_WINDOW = 8  # shards per bucketing window over the synthetic set at most (~1.75 h of audio): with one
# decompression thread per reader a reader's work per audio second is each shard decompressed once and each
# batch built, whatever the window's size; the conformer's 128-shard windows would need 28 h a window
COLUMNS = ["preset", "batch", "mean utt s", "appetite audio s/s", "appetite spread %",
           "supply audio s/s per reader", "supply spread %", "readers per GPU", "host cores", "GPUs this host feeds"]


def librispeech_durations(n: int, rng: np.random.Generator) -> np.ndarray:
    """(n,) seconds with LibriSpeech train's spread: most 10-17 s, a short tail, 1-35 s, mean ~12.3."""
    d = rng.normal(13.5, 3.5, n)
    short = rng.random(n) < 0.12
    d[short] = rng.uniform(1.0, 9.0, short.sum())
    return np.clip(d, 1.0, 35.0)


def readers_per_gpu(appetite: float, per_reader: float) -> int:
    """Reader processes (cores) that supply one GPU's appetite, both in audio s/s."""
    if appetite <= 0 or per_reader <= 0:
        raise SpeechperfError(f"appetite {appetite} and supply per reader {per_reader} must be > 0 audio s/s")
    return math.ceil(appetite / per_reader)


def gpus_fed(cores: int, readers: int) -> float:
    """GPUs ``cores`` cores keep fed at ``readers`` readers per GPU, one core per GPU kept for
    its training process (the one that launches the GPU's work)."""
    return cores / (readers + 1)


def summary(times: list[float]) -> tuple[float, float]:
    """Median and spread % ((max - min) / median) of window times."""
    med = statistics.median(times)
    return med, 100.0 * (max(times) - min(times)) / med


def recorded(preset: str, profile: str | None = None, path: Path = PROFILES) -> dict:
    """A recorded profile's row for ``preset``, with the profile's name, device, torch, commit,
    date and source; refused (exit 2) naming the file when the profile or preset is not there."""
    profiles = tomllib.loads(path.read_text())["profile"]
    chosen = next((p for p in profiles if p["name"] == profile), None) if profile else profiles[0]
    if chosen is None:
        raise SpeechperfError(f"{path}: no profile {profile!r} (there: {', '.join(p['name'] for p in profiles)})")
    if preset not in chosen["presets"]:
        raise SpeechperfError(f"{path}: profile {chosen['name']!r} records no appetite for preset {preset!r} (there: "
                              f"{', '.join(chosen['presets'])}); measure it on a GPU or with --device cpu")
    meta = {k: v for k, v in chosen.items() if k != "presets"}
    return {**chosen["presets"][preset], **meta}


def synthetic_batch(durations: np.ndarray, rng: np.random.Generator, device: torch.device,
                    labels_per_s: float = CHARS_PER_S) -> Batch:
    """A padded batch of random features at ``durations`` (seconds), on ``device``, ``labels_per_s``
    labels a second of audio (a transducer's joint grows with them)."""
    frames = np.maximum((durations / FRAME_S).astype(np.int64), 20)
    label_lens = torch.tensor(np.maximum((durations * labels_per_s).astype(np.int64), 1))
    feats = torch.randn(len(frames), int(frames.max()), FeatureConfig().dim, device=device)  # (B, T, 93)
    labels = torch.randint(2, 28, (int(label_lens.sum()),), device=device)
    return Batch(feats, torch.tensor(frames), labels, label_lens, [""] * len(frames), [""] * len(frames),
                 float(durations.sum()))


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def appetite(cfg, device: torch.device, windows: int, steps: int, warmup: int,
             labels_per_s: float = CHARS_PER_S) -> dict:
    """The training step's audio s/s on resident batches of ``loader.batch_size`` utterances."""
    tc, bs = cfg.train, cfg.loader.batch_size
    torch.manual_seed(tc.seed)
    model = build_model(cfg.model).to(device).train()
    fp8.prepare(model, tc.system.precision, device)  # fp8: torchao's float8 Linear layers, as a run has them
    if tc.system.compile:  # as the one-device loop compiles it (train/trainer.py); the warm-up compiles
        model = compiled(model)
    opt = make_optimizer(model, tc, device)
    scaler = torch.amp.GradScaler(device.type, enabled=tc.system.precision == "fp16")
    rng = np.random.default_rng(tc.seed)
    pool = np.sort(librispeech_durations(bs * 4, rng))  # 4 length buckets, as the loader's bucket mode cuts them
    batches = [synthetic_batch(pool[i * bs:(i + 1) * bs], rng, device, labels_per_s) for i in range(4)]
    for i in range(warmup):
        train_step(model, batches[i % 4], opt, scaler, device, tc)
    times, audio = [], sum(b.audio_seconds for b in batches) / 4
    for _ in range(windows):
        _sync(device)
        t0 = time.perf_counter()
        for i in range(steps):
            train_step(model, batches[i % 4], opt, scaler, device, tc)
        _sync(device)
        times.append((time.perf_counter() - t0) / steps)
    step_s, spread = summary(times)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    return {"s_per_step": step_s, "audio_s_per_s": audio / step_s, "spread_pct": spread,
            "mean_utt_s": audio / bs, "source": f"measured on {name} ({device}), {tc.system.precision}, "
            f"{windows} windows of {steps} steps after {warmup} warm-up"}


def write_synthetic(out: Path, utterances: int, seed: int = 0) -> Path:
    """A prepared-features folder (one split ``train-feed``, stats.json) of random frames at
    LibriSpeech lengths, ``utterances`` of them, written with the package's shard writer."""
    rng = np.random.default_rng(seed)
    split, dim = out / "train-feed", FeatureConfig().dim
    split.mkdir(parents=True, exist_ok=True)
    durs = librispeech_durations(max(utterances, 1), rng)
    words = SentenceGenerator(seed)  # English-like text: subword units trained on it split it as they split speech's
    utts, shards = [], {}
    for k, lo in enumerate(range(0, len(durs), SHARD_UTTS)):
        part = durs[lo:lo + SHARD_UTTS]
        frames = [(rng.standard_normal((int(d / FRAME_S), dim)) * 4).astype(np.float32) for d in part]
        ids = [f"feed-{lo + i:06d}" for i in range(len(part))]
        texts = [_text(words, int(d * CHARS_PER_S)) for d in part]
        shards[shard_name(k)] = write_shard(split / f"{shard_name(k)}.npz", frames, ids, texts, list(part))
        utts += [{"id": i, "shard": shard_name(k), "offset": j, "frames": len(f), "duration": len(f) * FRAME_S,
                  "transcript": t, "speaker": "0"} for j, (i, f, t) in enumerate(zip(ids, frames, texts))]
    write_json(split / "index.json", {"split": "train-feed", "utterances": utts, "shards": shards, "problems": []})
    write_json(out / "stats.json", {"mean": [0.0] * dim, "std": [4.0] * dim, "splits": ["train-feed"]})
    return out


def _text(words: SentenceGenerator, chars: int) -> str:
    """Sentences joined to ``chars`` characters (LibriSpeech's rate), cut at a word's end."""
    text = ""
    while len(text) < chars:
        text = f"{text} {words.sentence()}".strip()
    cut = text.rfind(" ", 0, chars + 1)
    return text[:cut] if cut > 0 else text[:max(chars, 1)]


def train_splits(feats: Path) -> list[str]:
    found = sorted(p.parent.name for p in Path(feats).glob("train*/index.json"))
    if not found:
        raise SpeechperfError(f"{feats}: no prepared training split (train*/index.json); prepare one with "
                              f"speechperf prepare, or leave --data out for a synthetic set")
    return found


def supply(feats: Path, loader_cfg, readers: int, windows: int, seed: int, units: Units | None = None) -> dict:
    """Audio s/s the real loader delivers with ``readers`` reader processes, per reader: each of
    ``windows`` timed spans is ``readers`` whole bucketing windows of epoch 2 (the readers own
    windows in rotation), timed from the last batch of the span before it; the first span
    (processes starting, first shards) is not timed."""
    cfg = replace(loader_cfg, readers=readers)
    # epoch 2: epoch 1 may be SortaGrad's; ``units``: those run_feed settled (else read from ``feats``)
    loader = make_loader(feats, train_splits(feats), cfg, epoch=2, seed=seed, units=units)
    try:
        ends = span_ends(loader.plan.groups, readers, windows + 1)
    except SpeechperfError as e:
        raise SpeechperfError(f"{feats}: {e} (windows of {cfg.bucket_window} shards; more data, or fewer --windows "
                              "or --readers)") from None
    rates, audio, t_last, timed = [], 0.0, None, [0.0, 0]  # timed: audio s and utterances of the timed spans
    with loader:  # read in part: its readers stopped when the spans are timed (or a signal stops it)
        for i, b in zip(range(ends[-1] + 1), loader):
            audio += b.audio_seconds
            if t_last is not None:
                timed[0], timed[1] = timed[0] + b.audio_seconds, timed[1] + len(b.ids)
            if i in ends:
                now = time.perf_counter()
                if t_last is not None:
                    rates.append(audio / (now - t_last) / readers)
                audio, t_last = 0.0, now
    med = statistics.median(rates)
    return {"audio_s_per_s_per_reader": med, "spread_pct": 100.0 * (max(rates) - min(rates)) / med,
            "mean_utt_s": timed[0] / timed[1]}


def span_ends(groups: np.ndarray, readers: int, spans: int) -> list[int]:
    """The last batch of each of ``spans`` spans of ``readers`` whole windows, from the plan's
    window of each batch (``groups``: a window's batches are consecutive)."""
    starts = np.flatnonzero(np.diff(groups, prepend=-1)).tolist() + [len(groups)]  # each window's first batch
    if len(starts) - 1 < spans * readers:
        raise SpeechperfError(f"the supply times spans of {readers} whole windows, {spans} of them with the untimed "
                              f"first: {spans * readers} windows, and an epoch holds {len(starts) - 1}")
    return [starts[(k + 1) * readers] - 1 for k in range(spans)]


def supply_utterances(readers: int, windows: int, window_shards: int) -> int:
    """Synthetic utterances for ``windows`` timed spans of ``readers`` windows of ``window_shards``
    shards, and the untimed span before them."""
    return (windows + 1) * readers * window_shards * SHARD_UTTS


def run_feed(preset: str, overrides: list[str] = (), data: Path | None = None, device: str = "auto",
             profile: str | None = None, readers: int = 1, windows: int = 3, steps: int = 5, warmup: int = 3,
             cores: int | None = None) -> dict:
    """One row: the preset's appetite (measured on a GPU or on ``device="cpu"``, else the
    recorded ``profile``'s), the supply per reader, the readers one GPU needs and the GPUs this
    host's ``cores`` (default: all it has) can feed. Batches hold ``loader.batch_size``
    utterances (``max_duration`` off) for the appetite, at most ``SUPPLY_BATCH`` for the supply."""
    check_counts(readers=readers, windows=windows, steps=steps, warmup=warmup, cores=cores)
    cfg = load_preset(preset, list(overrides))
    cfg = replace(cfg, loader=Batching(cfg.loader).by_count().loader)  # what the appetite and supply measure
    loader = replace(cfg.loader, batch_size=min(cfg.loader.batch_size, SUPPLY_BATCH))
    if not data:
        loader = replace(loader, bucket_window=min(loader.bucket_window, SYNTHETIC_WINDOW))
    with sigterm_stops(), tempfile.TemporaryDirectory(prefix="speechperf-feed-") as tmp:  # SIGTERM: removed too
        # the data and its units first, as a run trains its BPE before the clock: a folder that cannot
        # supply this preset fails in seconds, not after minutes of appetite (found: 7.7 min on 2 cores)
        feats = Path(data) if data else write_synthetic(Path(tmp),
                                                        supply_utterances(readers, windows, loader.bucket_window))
        units = ensure_units(feats, cfg.loader.units, train_splits(feats))
        labels = label_rate(feats, units, synthetic=not data)
        app, src = measured_appetite(cfg, device, profile, preset, windows, steps, warmup, labels)
        sup = supply(feats, loader, readers, windows, cfg.train.seed, units)
    need = readers_per_gpu(app["audio_s_per_s"], sup["audio_s_per_s_per_reader"])
    host = cores or os.cpu_count() or 1
    return {"preset": preset, "batch": app.get("batch", cfg.loader.batch_size),
            "mean utt s": round(app["mean_utt_s"], 2),
            "appetite audio s/s": round(app["audio_s_per_s"], 1), "appetite spread %": _r(app["spread_pct"]),
            "appetite source": src, "supply audio s/s per reader": round(sup["audio_s_per_s_per_reader"], 1),
            "supply spread %": _r(sup["spread_pct"]), "supply mean utt s": round(sup["mean_utt_s"], 2),
            "readers": readers,
            "supply data": f"{data or 'synthetic'}, {loader.bucket_window}-shard windows",
            "readers per GPU": need, "host cores": host, "GPUs this host feeds": round(gpus_fed(host, need), 2),
            "resident": cfg.loader.resident}


def label_rate(feats: Path, units: Units, synthetic: bool = False) -> tuple[float, str]:
    """(labels per second of audio, how it was found): the training transcripts of ``feats`` in the
    run's units (a transducer's joint, (B, T, U+1, V), grows with them). ``synthetic``: the set of
    :func:`write_synthetic`, English-like sentences at LibriSpeech's 15 characters a second."""
    ix = load_index(feats, train_splits(feats))
    labels = sum(len(units.encode(ix.transcript(u))) for u in range(len(ix)))
    rate = labels / max(float(ix.duration.sum()), 1e-9)
    where = (f"synthetic English-like transcripts at {CHARS_PER_S:g} characters/s" if synthetic
             else f"{feats}'s training transcripts")
    return rate, f"labels at {rate:.3g}/s: {where} in {units.spec}"


def measured_appetite(cfg, device: str, profile: str | None, preset: str, windows: int, steps: int,
                      warmup: int, labels: tuple[float, str] = (CHARS_PER_S, "")) -> tuple[dict, str]:
    """The preset's appetite and where it comes from: measured on ``device`` (a GPU when torch
    sees one under "auto") with ``labels`` (:func:`label_rate`: per second, and how found), else the
    recorded ``profile``'s."""
    dev = torch.device("cpu") if device == "cpu" else None
    if dev is None and (device != "auto" or torch.cuda.is_available()):
        dev = pick_device(device, DistEnv())
    if dev is not None:
        if cfg.train.system.cuda_graphs:  # a run replays planned shapes from graphs; this step runs as it is built
            raise SpeechperfError("bench feed: train.system.cuda_graphs=true is not measured here (the appetite is "
                                  "the eager or compiled step; benchmarks/run.py step_floor measures the graphed one)")
        cfg = settled(cfg, dev)  # train.system.precision=auto: the one a run would choose here (cached per machine)
        note = check_precision(cfg, dev)  # a precision this device cannot run: refused, naming why
        app = appetite(cfg, dev, windows, steps, warmup, labels[0])
        return app, "; ".join(x for x in (app["source"], note, labels[1]) if x)
    rec = recorded(preset, profile)
    app = {"audio_s_per_s": rec["audio_s_per_s"], "spread_pct": None, "mean_utt_s": rec["mean_utt_s"],
           "batch": rec["batch"]}
    return app, (f"appetite from recorded profile {rec['name']} ({rec['device']}, torch {rec['torch']}, commit "
                 f"{rec['commit']}, {rec['date']}; {rec['source']}); no GPU here")


# the least of each count bench feed takes (a median needs a window, a supply a reader), and the most
# readers: a synthetic set sized for 10^9 readers asked 14.9 TiB
LEAST = {"readers": 1, "windows": 1, "steps": 1, "warmup": 0, "cores": 1}
MAX_READERS = 256


def check_counts(**counts: int | None) -> None:
    """Refuse a count bench feed cannot measure with (exit 2, naming it), before anything is built
    (``cores`` None: the host's)."""
    for name, value in counts.items():
        if value is not None and value < LEAST[name]:
            raise SpeechperfError(f"bench feed --{name} {value}: must be at least {LEAST[name]}")
    if counts["readers"] > MAX_READERS:
        raise SpeechperfError(f"bench feed --readers {counts['readers']}: at most {MAX_READERS} reader processes")


def _r(x: float | None) -> float | None:
    return None if x is None else round(x, 1)


def notes(row: dict) -> list[str]:
    out = [row["appetite source"],
           f"one GPU eats {row['appetite audio s/s']:.0f} audio s/s; one reader supplies "
           f"{row['supply audio s/s per reader']:.0f} ({row['supply data']}, {row['readers']} reader(s)): "
           f"{row['readers per GPU']} reader cores per GPU, and this host's {row['host cores']} cores feed "
           f"{row['GPUs this host feeds']} GPUs (one core per GPU kept for its training process)"]
    app, sup = row["mean utt s"], row["supply mean utt s"]
    if abs(sup - app) > LENGTHS_APART * app:
        out.append(f"warning: the supply was read at {sup:.1f} s an utterance and the appetite at {app:.1f} s: both "
                   "rates change with the length (a step's and a batch's fixed costs), so the readers per GPU "
                   "compare different lengths; the appetite is read at LibriSpeech's: give --data of such lengths, "
                   "or none (synthetic ones)")
    if row.get("resident"):  # data/resident.py: epochs 2+ are cut on the device
        out.append(f"loader.resident: the {row['readers per GPU']} reader cores per GPU feed the first epoch only (and "
                   "a resumed run's one read of the split); later epochs cut their batches from the training split "
                   "kept on the GPU and need no reader core (loader.resident=false: every epoch)")
    return out
