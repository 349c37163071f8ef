"""Our CPU dropout (speechperf.models.dropout) against torch's nn.Dropout, in one process:
1. one feed-forward activation (24 x 90 x 576, the conformer-cpu preset's widest), forward
   and backward; 2. whole conformer-cpu training steps on the same synthetic batches, the
   model once with our dropout and once with torch's, interleaved so drift hits both.
Prints medians, spreads and the ratios torch / ours.

Usage: python benchmarks/bench_dropout.py [--threads 2] [--steps 6]
"""
from __future__ import annotations

import argparse
import copy
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

from _timing import measure, show
from speechperf.config import load_preset
from speechperf.models import build_model
from speechperf.models.dropout import Dropout, dropout


def with_torch_dropout(model: nn.Module) -> nn.Module:
    """A copy of ``model`` whose every speechperf Dropout is torch's nn.Dropout of the same p."""
    model = copy.deepcopy(model)
    for module in list(model.modules()):
        for name, child in module.named_children():
            if isinstance(child, Dropout):
                setattr(module, name, nn.Dropout(child.p))
    return model


def op_ratio(p: float) -> None:
    x = torch.randn(24, 90, 576, requires_grad=True)
    ours = measure(lambda: dropout(x, p, True).sum().backward(), repeats=20, warmup=3)
    theirs = measure(lambda: F.dropout(x, p, True).sum().backward(), repeats=20, warmup=3)
    print(show("ours  F+B (24, 90, 576)", {k: v * 1e3 for k, v in ours.items()}, "ms"))
    print(show("torch F+B (24, 90, 576)", {k: v * 1e3 for k, v in theirs.items()}, "ms"))
    print(f"op ratio torch / ours: {theirs['median'] / ours['median']:.2f}x")


def step_ratio(steps: int) -> None:
    cfg = load_preset("conformer-cpu").model
    torch.manual_seed(0)
    models = {"ours": build_model(cfg)}
    models["torch"] = with_torch_dropout(models["ours"])
    opts = {k: torch.optim.AdamW(m.parameters(), 1e-4) for k, m in models.items()}
    gen = torch.Generator().manual_seed(1)
    times = {k: [] for k in models}
    for i in range(steps + 1):  # the first step of each is the warm-up
        frames = int(torch.randint(150, 400, (1,), generator=gen))
        x = torch.randn(24, frames, 93, generator=gen)
        lens = torch.full((24,), frames)
        labels = torch.randint(1, 30, (24, frames // 8), generator=gen)
        for k, m in models.items():
            t = time.perf_counter()
            out_lens, kw = m.plan(lens, frames)
            lp, _ = m(x, lens, **kw)
            loss = F.ctc_loss(lp, labels, out_lens, torch.full((24,), frames // 8), zero_infinity=True)
            opts[k].zero_grad()
            loss.backward()
            opts[k].step()
            if i:
                times[k].append(time.perf_counter() - t)
    for k, ts in times.items():
        print(f"conformer-cpu step, {k} dropout: median {statistics.median(ts) * 1e3:.0f} ms "
              f"(min {min(ts) * 1e3:.0f}, max {max(ts) * 1e3:.0f}) over {len(ts)} steps of 24 utterances")
    ratios = [t / o for t, o in zip(times["torch"], times["ours"])]
    print(f"step ratio torch / ours (per-step median): {statistics.median(ratios):.2f}x")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--p", type=float, default=0.1)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    print(f"torch {torch.__version__}, {a.threads} thread(s), p = {a.p}")
    op_ratio(a.p)
    step_ratio(a.steps)


if __name__ == "__main__":
    main()
