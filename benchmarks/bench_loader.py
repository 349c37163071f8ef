"""Loader speed vs the demo model's appetite, on the same prepared features.

Goal: the loader delivers batches at least 5x faster than the CPU preset's
model consumes them (train steps/s). Also prints the padded-frame ratio pad / bucket.
Usage: python benchmarks/bench_loader.py FEATS [--preset cpu] [--batches 40]
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).parent))
from speechperf.config import load_preset  # noqa: E402
from speechperf.data.loader import make_loader  # noqa: E402
from speechperf.models import build_model  # noqa: E402


def splits(feats: Path) -> list[str]:
    return sorted(p.name for p in feats.iterdir() if p.name.startswith("train") and (p / "index.json").exists())


def loader_rate(feats, cfg, n) -> float:
    it = iter(make_loader(feats, splits(feats), cfg, epoch=1, seed=1))
    next(it)  # worker start-up is not steady state
    t = time.perf_counter()
    k = 0
    for k, _ in zip(range(n), it):
        pass
    return (k + 1) / (time.perf_counter() - t)


def model_rate(feats, run_cfg, n) -> float:
    model = build_model(run_cfg.model)
    opt = torch.optim.AdamW(model.parameters(), 1e-3)
    batches = [b for _, b in zip(range(n + 2), make_loader(feats, splits(feats), run_cfg.loader, epoch=1, seed=1))]
    def step(b):
        lp, ol = model(b.feats, b.feat_lens)
        loss = F.ctc_loss(lp, b.labels, ol, b.label_lens, zero_infinity=True)
        opt.zero_grad()
        loss.backward()
        opt.step()
    for b in batches[:2]:
        step(b)
    t = time.perf_counter()
    for b in batches[2:]:
        step(b)
    return n / (time.perf_counter() - t)


def padded_frames(feats, cfg, n) -> int:
    return sum(b.feats.shape[0] * b.feats.shape[1] for _, b in zip(range(n), make_loader(feats, splits(feats), cfg, 1, 1)))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("feats", type=Path)
    ap.add_argument("--preset", default="cpu")
    ap.add_argument("--batches", type=int, default=40)
    a = ap.parse_args()
    run_cfg = load_preset(a.preset)
    lo = run_cfg.loader
    rates = {f"readers={r}": loader_rate(a.feats, lo.__class__(**{**lo.__dict__, "readers": r}), a.batches) for r in (0, lo.readers)}
    steps = model_rate(a.feats, run_cfg, max(5, a.batches // 4))
    for name, r in rates.items():
        print(f"loader {name}: {r:.1f} batches/s")
    print(f"model ({a.preset} preset) train steps: {steps:.2f} steps/s")
    best = rates[f"readers={lo.readers}"]
    print(f"ratio loader / model (preset readers={lo.readers}): {best / steps:.1f}x  (goal >= 5x)")
    pad = padded_frames(a.feats, lo.__class__(**{**lo.__dict__, "mode": "pad", "readers": 0}), a.batches)
    bucket = padded_frames(a.feats, lo.__class__(**{**lo.__dict__, "mode": "bucket", "readers": 0}), a.batches)
    print(f"frames computed over {a.batches} batches: pad {pad}, bucket {bucket}, ratio pad / bucket {pad / bucket:.2f}")


if __name__ == "__main__":
    main()
