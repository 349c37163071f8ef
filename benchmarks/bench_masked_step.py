"""The optimizer step that can be undone on the device (train/step.py ``masked_step``): a fused
optimizer's ``found_inf`` flag against the copy-back path (``copy_back_step``, the named
reference: every parameter and state tensor copied before the step and copied back where the
step was not finite), in the same process, on one preset's model.

Prints, per path, the seconds per step (median and spread over ``--repeats`` after a warm-up)
and the operators dispatched per step (torch.profiler's count of aten calls: on a GPU each is a
kernel launch, so the count says what the path costs there independently of this machine's
speed). Both paths' parameters are checked equal after the steps.

Usage: python benchmarks/bench_masked_step.py [--preset conformer] [--device cuda] [--repeats 5] [--json]
"""
from __future__ import annotations

import argparse
import json

import torch

from _timing import measure
from speechperf.config import load_preset
from speechperf.models import build_model
from speechperf.train.step import copy_back_step, make_optimizer, masked_step


def setup(preset: str, device: torch.device):
    cfg = load_preset(preset, ["train.optimizer_impl=fused"] if load_preset(preset).train.optimizer != "adadelta" else [])
    torch.manual_seed(0)
    model = build_model(cfg.model).to(device)
    for p in model.parameters():
        p.grad = torch.randn_like(p) * 1e-3
    return model, make_optimizer(model, cfg.train, device)


def synced(fn, device: torch.device):
    """``fn`` timed to its end on the device (a GPU runs it asynchronously)."""
    def run(*args):
        fn(*args)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    return run


def ops_per_step(fn, opt, ok) -> int:
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        fn(opt, ok)
    return sum(e.count for e in prof.key_averages() if e.key.startswith("aten::"))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", default="conformer")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--device", default="cpu")
    p.add_argument("--json", action="store_true")
    a = p.parse_args()
    device = torch.device(a.device)
    ok = torch.tensor(True, device=device)
    rows, models = {}, {}
    for name, fn in (("copy-back", copy_back_step), ("masked_step", masked_step)):
        model, opt = setup(a.preset, device)
        step = synced(fn, device)
        m = measure(lambda: step(opt, ok), repeats=a.repeats, warmup=1)
        rows[name] = {"step_s": m, "ops": ops_per_step(fn, opt, ok),
                      "tensors": sum(1 for _ in model.parameters()), "fused": bool(opt.defaults.get("fused"))}
        models[name] = model
    same = all(torch.equal(x, y) for x, y in zip(models["copy-back"].parameters(), models["masked_step"].parameters()))
    out = {"preset": a.preset, "device": str(device), **rows, "same_parameters": same,
           "ops_ratio": rows["copy-back"]["ops"] / rows["masked_step"]["ops"],
           "time_ratio": rows["copy-back"]["step_s"]["median"] / rows["masked_step"]["step_s"]["median"]}
    if a.json:
        print(json.dumps(out, indent=1))
    else:
        print(f"preset {a.preset} on {device}: {rows['masked_step']['tensors']} parameter tensors, fused={rows['masked_step']['fused']}")
        for name in rows:
            r = rows[name]
            print(f"  {name:12s} {r['step_s']['median'] * 1e3:8.1f} ms a step (min {r['step_s']['min'] * 1e3:.1f}, "
                  f"max {r['step_s']['max'] * 1e3:.1f}), {r['ops']} aten ops")
        print(f"  copy-back / masked_step: {out['time_ratio']:.2f}x time, {out['ops_ratio']:.1f}x ops; "
              f"parameters equal: {same}")
    if not same:
        raise SystemExit("the two paths' parameters differ")


if __name__ == "__main__":
    main()
