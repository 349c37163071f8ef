"""The conformer's attention with its head dimension as is against zero-padded to a multiple of 8
(speechperf.models.conformer.attend), forward + backward, both in one process.

Shapes from the preset: H heads of Dh = d_model / heads; per utterance length S seconds, B =
max_duration / S utterances (the batch by audio the preset's loader builds) of T = S / 10 ms /
subsampling frames, keys masked past lengths in [0.9 T, T] (length-bucketed batches), dropout at
the preset's attention_dropout. q, k and v come out of one (B, T, 3, H, Dh) projection as in the
model (q and k copied by the rotation, v a strided view), and the gradient flows back into it.
Per path: the median forward + backward (ms, min and max), times the preset's layers (the
attention's share of a training step), the ratio unpadded / padded, the SDPA backend that ran
(the aten op under aten::scaled_dot_product_attention) and, on CUDA, the kernel family and the
top kernels (torch.profiler) and which fused backends torch's own checks allow
(torch.backends.cuda.can_use_*); and each path's largest error against the same call in a wider
dtype without dropout (fp32 for bf16 inputs, fp64 for fp32).

Usage: python benchmarks/bench_attention.py [--preset conformer] [--device cuda|cpu] [--seconds 4 12.4]
           [--batch N] [--repeats N] [--dtype bf16|fp32] [--json]
On a CPU the batch defaults to 8 and the repeats to 3 (the preset's ~400 utterances are a GPU's);
kernel columns read n/a there.
"""
from __future__ import annotations

import argparse
import sys

import torch
import torch.nn.functional as F

from _timing import measure
from speechperf.config import load_preset
from speechperf.errors import SpeechperfError
from speechperf.models.conformer import FUSED_ALIGN, attend
from speechperf.tables import emit_json, format_table

FRAME_S = 0.01  # seconds per feature frame (the features' 10 ms hop)
DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}
# kernel-name fragments, in the order they decide a path's family (softmax alone: the unfused math path)
FAMILIES = (("fmha", "mem-efficient (cutlass fmha)"), ("flash", "flash"), ("cudnn", "cudnn"),
            ("softmax", "math (softmax + GEMMs)"))


def inputs(b: int, t: int, heads: int, dh: int, dtype: torch.dtype, device: torch.device, seed: int = 0):
    """The (B, T, 3, H, Dh) projection (a leaf needing gradients) and the (B, T) key mask."""
    g = torch.Generator().manual_seed(seed)
    qkv = torch.randn(b, t, 3, heads, dh, generator=g).to(device, dtype).requires_grad_()
    lengths = torch.randint(max(1, (9 * t) // 10), t + 1, (b,), generator=g)
    lengths[0] = t  # the batch is as long as its longest utterance
    return qkv, (torch.arange(t)[None, :] < lengths[:, None]).to(device)


def split(qkv: torch.Tensor):
    """(B, T, 3, H, Dh) -> q, k (contiguous, as RoPE's output is) and v (a view), each (B, H, T, Dh)."""
    p = qkv.permute(2, 0, 3, 1, 4)  # (3, B, H, T, Dh)
    return p[0].contiguous(), p[1].contiguous(), p[2]


def forward_backward(qkv, mask, p: float, pad: bool, grad_out: torch.Tensor):
    q, k, v = split(qkv)
    h = attend(q, k, v, mask, p, pad=pad)
    return torch.autograd.grad(h, qkv, grad_out)


def synced(fn, device: torch.device):
    def run():
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    return run


def backend_and_kernels(fn, device: torch.device) -> tuple[str, str, str]:
    """(the SDPA aten op that ran, the kernel family, the top three kernels by device time) of one call."""
    acts = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with torch.profiler.profile(activities=acts) as prof:
        fn()
    events = prof.key_averages()
    ops = sorted({e.key.removeprefix("aten::_scaled_dot_product_") for e in events
                  if e.key.startswith("aten::_scaled_dot_product_") and "backward" not in e.key})
    if device.type != "cuda":
        return "+".join(ops) or "none", "n/a", "n/a"
    kernels = sorted((e for e in events if e.device_type == torch.autograd.DeviceType.CUDA and e.self_device_time_total > 0),
                     key=lambda e: -e.self_device_time_total)
    names = [e.key for e in kernels]
    family = next((fam for frag, fam in FAMILIES if any(frag in n.lower() for n in names)), "other")
    return "+".join(ops) or "none", family, "; ".join(n[:60] for n in names[:3])


def eligible(qkv, mask, p: float, pad: bool) -> str:
    """The fused backends torch's dispatch checks allow for the tensors SDPA sees (CUDA only)."""
    from torch.backends.cuda import (SDPAParams, can_use_cudnn_attention, can_use_efficient_attention,
                                     can_use_flash_attention)
    q, k, v = (t.detach() for t in split(qkv))
    if pad:
        q, k, v = (F.pad(t, (0, -t.shape[-1] % FUSED_ALIGN)) for t in (q, k, v))
    params = SDPAParams(q, k, v, mask[:, None, None, :], p, False, False)
    ok = [name for name, check in (("efficient", can_use_efficient_attention), ("cudnn", can_use_cudnn_attention),
                                   ("flash", can_use_flash_attention)) if check(params)]
    return "+".join(ok) or "none"


def error_vs_wider(qkv, mask, pad: bool) -> float:
    """Largest |out - out in a wider dtype| without dropout: what the path costs in accuracy."""
    wide = torch.float64 if qkv.dtype == torch.float32 else torch.float32
    with torch.no_grad():
        got = attend(*split(qkv), mask, 0.0, pad=pad).to(wide)
        want = attend(*split(qkv.to(wide)), mask, 0.0, pad=False)
    return float((got - want).abs().max())


def case(seconds: float, b: int, t: int, cfg, a, device: torch.device) -> list[dict]:
    heads, dh, p = cfg.heads, cfg.d_model // cfg.heads, cfg.attention_dropout
    qkv, mask = inputs(b, t, heads, dh, DTYPES[a.dtype], device)
    grad_out = torch.randn(b, heads, t, dh, generator=torch.Generator().manual_seed(1)).to(device, qkv.dtype)
    rows = []
    for pad in (False, True):
        fn = synced(lambda: forward_backward(qkv, mask, p, pad, grad_out), device)
        m = measure(fn, repeats=a.repeats, warmup=a.warmup)
        op, family, kernels = backend_and_kernels(fn, device)
        rows.append({"utterance s": seconds, "B": b, "T": t, "H": heads, "Dh": dh, "path": "padded" if pad else "unpadded",
                     "head dim seen": dh + (-dh % FUSED_ALIGN if pad else 0), "F+B ms": m["median"] * 1e3,
                     "min ms": m["min"] * 1e3, "max ms": m["max"] * 1e3, f"x{cfg.layers} layers ms": m["median"] * 1e3 * cfg.layers,
                     "sdpa op": op, "kernel family": family, "top kernels": kernels,
                     "fused allowed": eligible(qkv, mask, p, pad) if device.type == "cuda" else "n/a",
                     "max err": error_vs_wider(qkv, mask, pad), "unpadded / padded": None})
    rows[1]["unpadded / padded"] = rows[0]["F+B ms"] / rows[1]["F+B ms"]
    return rows


def shape(cfg, seconds: float, batch: int | None) -> tuple[int, int]:
    """(B, T): ``batch`` or the utterances of ``seconds`` that fill the preset's max_duration, and
    the frames one of them has after the subsampling."""
    b = batch or max(1, int(cfg.loader.max_duration // seconds))
    return b, max(1, round(seconds / FRAME_S / cfg.model.subsampling))


def parse(argv) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--preset", default="conformer", help="a conformer preset (its heads, d_model, layers, batch)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=("cuda", "cpu"))
    ap.add_argument("--seconds", type=float, nargs="+", default=[4.0, 12.4],
                    help="utterance lengths (s): the embedded corpus's ~4 s and LibriSpeech's mean 12.4 s")
    ap.add_argument("--batch", type=int, default=None, help="utterances per batch (default: the preset's on CUDA, 8 on a CPU)")
    ap.add_argument("--repeats", type=int, default=None, help="timed calls per path (default 20 on CUDA, 3 on a CPU)")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--dtype", choices=tuple(DTYPES), default=None, help="default: bf16 on CUDA (autocast's), fp32 on a CPU")
    ap.add_argument("--threads", type=int, default=None, help="CPU threads (default: torch's)")
    ap.add_argument("--json", action="store_true")
    return ap.parse_args(argv)


def problems(a, cfg) -> list[str]:
    out = []
    if cfg.model.name != "conformer":
        out.append(f"preset {a.preset!r} is a {cfg.model.name!r} model, not a conformer")
    if a.device == "cuda" and not torch.cuda.is_available():
        out.append("--device cuda: torch sees no CUDA device")
    out += [f"--seconds {s}: must be > 0" for s in a.seconds if not s > 0]
    out += [f"--{k} {v}: must be >= {lo}" for k, v, lo in (("batch", a.batch, 1), ("repeats", a.repeats, 1),
                                                          ("warmup", a.warmup, 0), ("threads", a.threads, 1))
            if v is not None and v < lo]
    return out


def main(argv=None) -> int:
    a = parse(argv)
    try:
        cfg = load_preset(a.preset)
    except SpeechperfError as e:
        print(f"bench_attention: {e}", file=sys.stderr)
        return 2
    bad = problems(a, cfg)
    if bad:
        print("bench_attention: " + "; ".join(bad), file=sys.stderr)
        return 2
    device, cpu = torch.device(a.device), a.device == "cpu"
    a.repeats = a.repeats or (3 if cpu else 20)
    a.dtype = a.dtype or ("fp32" if cpu else "bf16")
    if a.threads:
        torch.set_num_threads(a.threads)
    rows = []
    for s in a.seconds:
        rows += case(s, *shape(cfg, s, a.batch or (8 if cpu else None)), cfg.model, a, device)
    head = {"preset": a.preset, "torch": torch.__version__, "device": torch.cuda.get_device_name(device) if not cpu else "cpu",
            "dtype": a.dtype, "dropout": cfg.model.attention_dropout, "repeats": a.repeats, "rows": rows}
    if a.json:
        emit_json(head)
    else:
        print(f"preset {a.preset}: torch {head['torch']} on {head['device']}, {a.dtype}, attention dropout "
              f"{head['dropout']}, median of {a.repeats}")
        print(format_table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
