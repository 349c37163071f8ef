"""How much audio a GPU eats: training steps per preset at LibriSpeech's utterance lengths.

The loader's goal (issue 29) is stated against what GPUs consume: audio seconds per second
per GPU. The figure quoted so far (about 2,700 audio s/s for the paper preset on one H100)
came from the embedded corpus's 3 s utterances; LibriSpeech's training utterances average
about 12.3 s (up to ~35 s), and a step's cost grows with length (LSTMs linearly, attention
quadratically), so the appetite is measured here at both lengths, same process, same model:
the named reference is the 3 s batch; the ratio is LibriSpeech-length / 3 s.

Each step is the package's own training step (``train.step.train_step``: planned forward,
CTC in fp32, backward, clip, masked optimizer step) on the preset's model, optimizer and
precision, with batches already on the host (the loader is not timed here). Batches hold
the preset's ``loader.batch_size`` utterances (or, with ``--max-duration``, as many as fit
that many seconds), lengths drawn from a LibriSpeech-like spread and sorted into buckets as
the loader's bucket mode does. Warm-up steps first; CUDA synchronized around the timed steps.

Usage: python benchmarks/bench_gpu_appetite.py [--presets gpu,paper,conformer] [--steps 12] [--json]
"""
from __future__ import annotations

import argparse
import json
import time

import numpy as np
import torch

from speechperf.config import load_preset
from speechperf.data.loader import Batch
from speechperf.features.feature_config import FeatureConfig
from speechperf.models import build_model
from speechperf.train.step import make_optimizer, train_step

FRAME_S = 0.01  # 10 ms hop (features/feature_config.py)
CHARS_PER_S = 15.0  # LibriSpeech read speech: about 15 characters (with spaces) per second


def librispeech_durations(n: int, rng: np.random.Generator) -> np.ndarray:
    """(n,) seconds with LibriSpeech train's spread: most 10-17 s, mean ~12.3, 1-35 s."""
    d = rng.normal(13.5, 3.5, n)
    short = rng.random(n) < 0.12  # a tail of short utterances
    d[short] = rng.uniform(1.0, 9.0, short.sum())
    return np.clip(d, 1.0, 35.0)


def make_batch(durations: np.ndarray, rng: np.random.Generator) -> Batch:
    """A padded batch of random features with plausible label lengths."""
    frames = np.maximum((durations / FRAME_S).astype(np.int64), 20)
    b, t, f = len(frames), int(frames.max()), FeatureConfig().dim
    feats = torch.randn(b, t, f)  # (B, T, 93)
    label_lens = torch.tensor(np.maximum((durations * CHARS_PER_S).astype(np.int64), 1))
    labels = torch.randint(2, 28, (int(label_lens.sum()),))
    return Batch(feats, torch.tensor(frames), labels, label_lens, [""] * b, [""] * b, float(durations.sum()))


def batches_for(durations: np.ndarray, batch_size: int, max_duration: float | None) -> list[np.ndarray]:
    """Length-sorted buckets, cut by count or by total seconds."""
    d = np.sort(durations)[::-1]
    if max_duration is None:
        return [d[i:i + batch_size] for i in range(0, len(d) - batch_size + 1, batch_size)]
    out, cur = [], []
    for x in d:
        if cur and sum(cur) + x > max_duration:
            out.append(np.array(cur))
            cur = []
        cur.append(x)
    return out


def measure(preset: str, lengths: str, steps: int, warmup: int, device: torch.device, max_duration) -> dict:
    cfg = load_preset(preset)
    tc = cfg.train
    torch.manual_seed(0)
    model = build_model(cfg.model).to(device)
    opt = make_optimizer(model, tc, device)
    scaler = torch.amp.GradScaler(device.type, enabled=tc.precision == "fp16")
    rng = np.random.default_rng(0)
    bs = cfg.loader.batch_size
    n = (steps + warmup) * bs * 2
    durs = librispeech_durations(n, rng) if lengths == "librispeech" else rng.uniform(1.5, 5.0, n)
    plan = batches_for(durs, bs, max_duration)
    plan = [plan[i] for i in rng.permutation(len(plan))[: steps + warmup]]  # a random mix of buckets
    batches = [make_batch(d, rng) for d in plan]
    model.train()
    for b in batches[:warmup]:
        train_step(model, b, opt, scaler, device, tc)
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    for b in batches[warmup:]:
        train_step(model, b, opt, scaler, device, tc)
    if device.type == "cuda":
        torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    timed = batches[warmup:]
    audio = sum(b.audio_seconds for b in timed)
    utts = sum(len(b.ids) for b in timed)
    return {"preset": preset, "lengths": lengths, "precision": tc.precision, "steps": len(timed),
            "mean utts/batch": utts / len(timed), "mean utt s": audio / utts, "s/step": dt / len(timed),
            "utts/s": utts / dt, "audio s/s": audio / dt,
            "peak GiB": torch.cuda.max_memory_allocated() / 2**30 if device.type == "cuda" else None}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--presets", default="gpu,paper,conformer")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--max-duration", type=float, default=None, help="seconds of audio per batch instead of counts")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    dev = torch.device(a.device)
    rows = []
    for p in a.presets.split(","):
        ref = measure(p, "embedded", a.steps, a.warmup, dev, a.max_duration)
        ls = measure(p, "librispeech", a.steps, a.warmup, dev, a.max_duration)
        ls["audio s/s vs 3 s"] = ls["audio s/s"] / ref["audio s/s"]
        rows += [ref, ls]
    env = {"device": torch.cuda.get_device_name(0) if dev.type == "cuda" else "cpu", "torch": torch.__version__}
    if a.json:
        print(json.dumps({"env": env, "rows": rows}, indent=1))
        return
    print(f"# {env}")
    for r in rows:
        print("  ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in r.items()))


if __name__ == "__main__":
    main()
