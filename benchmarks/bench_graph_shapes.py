"""How many shapes a ``train.system.cuda_graphs`` run captures on LibriSpeech 960 h, and the memory
their static buffers hold, for grids of ``train.system.graph_frames`` x ``train.system.graph_batch``, each
against the default grid (16 x 8) in the same process.

A projection, computed on any machine (no GPU): the planner's batches of every epoch over a
generated index with LibriSpeech 960 h's sizes and duration spread (data/index.py
``librispeech_like``: 281,241 utterances), each padded to the grid as train/graphs.py pads
it. Per shape, the buffers a graph keeps for the run's life: one gradient per parameter (the
backward graph of ``make_graphed_callables`` owns its parameters' gradients, one set per
graph), the padded input, the mask, the output and the output's gradient. Not counted: the
activations of the pool all graphs share (one pass's, the largest shape's), which any step of
that shape needs without graphs too. The padding column is the compute the grid adds: padded
rows x frames over the plain batches' (its longest utterance's frames x its utterances).

Usage: python benchmarks/run.py graph_shapes [--preset gpu] [--epochs 20]
       [--grids 16x8,32x16,64x32,128x64] [KEY=VALUE ...] [--json]
(default override loader.max_duration=3000: docs/presets.md's LibriSpeech batches for ``gpu``)
"""
from __future__ import annotations

import numpy as np

from speechperf.config import load_preset
from speechperf.data.index import librispeech_like
from speechperf.data.plan import batch_frames, plan_epoch
from speechperf.models import build_model
from speechperf.tables import emit
from speechperf.train.graphs import MEMORY_SHARE, round_up, static_bytes

GOAL = ("docs/gpu.md: a train.system.cuda_graphs run's static buffers within its share of the device's free memory "
        "(train/graphs.check_memory), at the least padding")
REFERENCE = "the default grid, 16 frames x 8 utterances, over the same planned batches"
RATIO = "shapes at the coarsest grid given / at 16x8"
DATA = False
DEFAULT_GRID = (16, 8)  # train.system.graph_frames, train.system.graph_batch defaults


def planned(cfg, epochs: int) -> list[np.ndarray]:
    """Per epoch, (batches, 2) int64: each planned batch's utterances and padded frames."""
    index = librispeech_like(0)
    out = []
    for epoch in range(1, epochs + 1):
        batches = plan_epoch(index, cfg.loader, epoch, cfg.train.seed).batches
        out.append(np.array([(len(b), batch_frames(index.frames[b], cfg.loader)) for b in batches], np.int64))
    return out


def grid_row(epochs: list[np.ndarray], grid: tuple[int, int], model, features: int) -> dict:
    """Shapes after the first and after every epoch, the padding the grid adds, and the static
    buffers of all shapes (MB) with the largest shape's."""
    frames_grid, batch_grid = grid
    first, every = set(), set()
    plain = padded = 0
    for e, sizes in enumerate(epochs):
        for b, t in sizes.tolist():
            shape = (round_up(b, batch_grid), round_up(t, frames_grid))
            every.add(shape)
            if e == 0:
                first.add(shape)
            plain, padded = plain + b * t, padded + shape[0] * shape[1]
    sizes = [static_bytes(model, {shape}, features) for shape in every]  # train/graphs.py's count, per shape
    return {"grid frames x utterances": f"{frames_grid}x{batch_grid}", "shapes epoch 1": len(first),
            f"shapes {len(epochs)} epochs": len(every), "padding %": round(100.0 * (padded / plain - 1), 2),
            "static GB": round(sum(sizes) / 1e9, 2), "largest shape MB": round(max(sizes) / 1e6, 1)}


def arguments(p) -> None:
    p.add_argument("--preset", default="gpu")
    p.add_argument("--epochs", type=int, default=20)
    p.add_argument("--grids", default="16x8,32x16,64x32,128x64", help="frames x utterances, comma-separated")
    p.add_argument("--json", action="store_true")
    p.add_argument("overrides", nargs="*", default=["loader.max_duration=3000"])


def run(a) -> dict:
    cfg = load_preset(a.preset, a.overrides)
    model = build_model(cfg.model)
    grids = [tuple(int(x) for x in g.split("x")) for g in a.grids.split(",")]
    if DEFAULT_GRID not in grids:
        grids.insert(0, DEFAULT_GRID)
    epochs = planned(cfg, a.epochs)
    rows = [grid_row(epochs, g, model, cfg.model.input_dim) for g in grids]
    ref = rows[grids.index(DEFAULT_GRID)]
    key = f"shapes {a.epochs} epochs"
    for r in rows:
        r["shapes vs 16x8"] = round(r[key] / ref[key], 3)
    emit(rows, a.json)
    if not a.json:
        print(f"{a.preset} ({' '.join(a.overrides)}), {sum(len(e) for e in epochs)} batches over {a.epochs} epochs of "
              f"a LibriSpeech 960 h-like index; static buffers per shape: parameter gradients "
              f"{sum(p.numel() for p in model.parameters()) * 4 / 1e6:.0f} MB + padded input, mask, output; a run "
              f"refuses more than {MEMORY_SHARE:.0%} of the device's free memory")
    return {"preset": a.preset, "overrides": a.overrides, "rows": rows, "ratio": rows[-1]["shapes vs 16x8"]}
