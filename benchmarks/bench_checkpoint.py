"""A checkpoint's cost to the training loop: the background write against the synchronous save.

Reference (``sync``): :func:`speechperf.results.checkpoint.save` without a writer: the loop
waits while the state is serialized, written, fsynced and renamed. ``background``: the same
call with a :class:`~speechperf.results.checkpoint_writer.CheckpointWriter`, as the recorder
makes it: the loop waits for the rows and a host copy of the state, the file is written on the
writer's thread (its seconds printed as ``write``). Both save the same state of the preset's
model (model, optimizer after one step, scheduler, scaler: what a run's checkpoint holds) into
a run folder under ``--dir``, in the same process, alternating. The first background save
allocates the host buffers that later ones reuse: printed apart (a run pays it once).

``beside``: how much slower a fixed matrix-multiply load runs while a background write is in
flight than alone (the write's CPU and memory traffic, shared with the loop on a small host).

Usage: python benchmarks/bench_checkpoint.py [--preset cpu --preset gpu] [--device cpu|cuda]
           [--repeats 3] [--dir /tmp]
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch

from speechperf.config import load_preset
from speechperf.models import build_model
from speechperf.results import checkpoint
from speechperf.results.checkpoint import TrainState
from speechperf.results.checkpoint_writer import CheckpointWriter
from speechperf.results.progress import Progress
from speechperf.results.run import Run
from speechperf.train.schedule import make_scheduler
from speechperf.train.step import make_optimizer


def train_state(preset: str, device: torch.device) -> TrainState:
    """The preset's model and optimizer after one step (every optimizer tensor exists)."""
    cfg = load_preset(preset)
    torch.manual_seed(0)
    model = build_model(cfg.model).to(device)
    opt = make_optimizer(model, cfg.train, device)
    sum(p.float().square().sum() for p in model.parameters()).backward()  # a gradient for every parameter
    opt.step()
    return TrainState(model, opt, make_scheduler(opt, cfg.train, Progress(), 1000),
                      torch.amp.GradScaler("cuda", enabled=False))


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def compute_s(a: torch.Tensor, n: int = 20) -> float:
    """Seconds of ``n`` square matmuls of ``a``: a stand-in for the loop's compute."""
    return timed(lambda: [a @ a for _ in range(n)])


def bench(preset: str, device: torch.device, repeats: int, folder: Path) -> dict:
    state = train_state(preset, device)
    mb = sum(t.numel() * t.element_size() for t in _tensors(state.state_dict())) / 2**20
    run = Run.create(folder / preset, kind="train", config={"preset": preset}, env={}, label=f"bench {preset}")
    writer, prog = CheckpointWriter(), Progress(iteration=1)
    a = torch.randn(768, 768)
    sync, blocking, write, alone, beside = [], [], [], [], []

    def timed_save(w: CheckpointWriter | None) -> float:
        if device.type == "cuda":  # the loop saves at a read point: nothing queued on the device
            torch.cuda.synchronize(device)
        return timed(lambda: checkpoint.save(run, prog, state.state_dict(), w))

    first = timed_save(writer)
    writer.wait()
    for _ in range(repeats):
        sync.append(timed_save(None))
        blocking.append(timed_save(writer))
        beside.append(compute_s(a))  # while the write is in flight
        write.append(writer.wait().write_s)
        alone.append(compute_s(a))
    run.close()
    return {"preset": preset, "mb": mb, "first": first, "sync": statistics.median(sync),
            "blocking": statistics.median(blocking), "write": statistics.median(write),
            "beside": statistics.median(beside) / statistics.median(alone)}


def _tensors(value):
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from _tensors(v)
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _tensors(v)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", action="append", help="repeatable (default: cpu and gpu)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--dir", type=Path, default=None, help="where the run folders go (default: a temporary one)")
    args = ap.parse_args()
    device = torch.device(args.device)
    print(f"torch {torch.__version__}, device {device}, {torch.get_num_threads()} threads; seconds per save "
          f"(median of {args.repeats})")
    print(f"{'preset':<8} {'state MB':>9} {'sync':>8} {'background':>11} {'ratio':>7} {'write':>8} "
          f"{'first':>8} {'beside':>7}")
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        for preset in args.preset or ["cpu", "gpu"]:
            r = bench(preset, device, args.repeats, Path(tmp))
            print(f"{r['preset']:<8} {r['mb']:>9.1f} {r['sync']:>8.3f} {r['blocking']:>11.3f} "
                  f"{r['sync'] / r['blocking']:>6.1f}x {r['write']:>8.3f} {r['first']:>8.3f} {r['beside']:>6.2f}x",
                  flush=True)
    print("sync: the synchronous save (reference); background: what the loop waits with the writer; ratio: "
          "sync / background; write: the writer thread's seconds (beside training); first: the first background "
          "save (allocates the host buffers); beside: a matmul load's time during a write / alone")


if __name__ == "__main__":
    main()
