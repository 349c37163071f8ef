"""``speechperf bench zoo``: end-to-end training throughput of the paper-002 model zoo and of
every registered acoustic model, with power and energy per sample from the telemetry sampler.

Models (Table 5 of paper 002, parameters ours vs theirs in ``PAPER_PARAMS_M``): ResNet-50,
Inception v3 and VGG16 from torchvision (see bench/vision.py for the CPU build of torch;
rows say "skipped" where torchvision is absent), a 2-layer LSTM language model of PTB size
(vocabulary 10,000, 1,500 units, sequence 20), a Transformer of WMT14 EN-DE base size
(d_model 512, 6+6 layers, shared 37,000-token vocabulary, sequence 512), and every acoustic
model of ``speechperf.models`` through the model contract (bench/acoustic.py: Deep Speech 2
with the paper preset's sizes, DNN, CLDNN, and any model registered later). Inputs are
synthetic tensors of the right shapes: throughput does not depend on their values. Batch
sizes default to Table 8's; acoustic models without a Table 8 entry to small ones on a CPU.

A precision the device cannot run for a model (bf16 for an LSTM on a CPU without AVX-512)
gives a row "unsupported on this CPU: ..." and is not tried; one it only emulates is
measured and flagged in ``precision_note`` (hardware/capability.py).
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F
from tqdm import tqdm

from speechperf.bench import acoustic
from speechperf.telemetry import timing
from speechperf.bench.ops import libraries
from speechperf.bench.store import SweepStore
from speechperf.bench.vision import vision_models
from speechperf.errors import SpeechperfError, in_words
from speechperf.models.contract import autocast
from speechperf.results import schema
from speechperf.hardware.capability import support
from speechperf.tables import write_csv

PAPER_PARAMS_M = {"resnet50": 26, "inception_v3": 27, "vgg16": 138, "lstm": 66, "ds2": 27, "transformer": 65}
TABLE8_BATCHES = {"resnet50": (64, 128), "inception_v3": (64, 128), "vgg16": (64, 128), "lstm": (64, 128, 256),
                  "ds2": (8, 16, 32), "transformer": (1024, 2048, 4096)}
# The columns of the text table (--json, --csv and the database hold every column)
COLUMNS = ("model", "batch", "precision", "multiply", "device", "params_m", "paper_params_m", "unit", "samples_per_s",
           "mfu_pct", "step_s", "iters", "spread_pct", "repeat_iqr_pct", "noisy", "power_w", "joules_per_sample",
           "precision_note",
           "status")
UNITS = {"resnet50": "images", "inception_v3": "images", "vgg16": "images", "lstm": "sentences",
         "ds2": "utterances", "transformer": "tokens"}


class LSTMLanguageModel(nn.Module):
    """Embedding -> 2-layer LSTM -> softmax over the vocabulary (PTB 'large' sizes)."""

    def __init__(self, vocab: int = 10_000, hidden: int = 1500, layers: int = 2):
        super().__init__()
        self.emb = nn.Embedding(vocab, hidden)
        self.lstm = nn.LSTM(hidden, hidden, layers, batch_first=True)
        self.out = nn.Linear(hidden, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h, _ = self.lstm(self.emb(tokens))  # (B, S, H)
        return self.out(h)  # (B, S, V)


class TransformerMT(nn.Module):
    """Transformer base for translation with a shared, tied source/target embedding."""

    def __init__(self, vocab: int = 37_000, d: int = 512):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.core = nn.Transformer(d, 8, 6, 6, 2048, dropout=0.1, batch_first=True)

    def forward(self, src: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
        h = self.core(self.emb(src), self.emb(tgt))  # (B, S, d)
        return h @ self.emb.weight.T  # (B, S, V), tied output projection


@dataclass(frozen=True)
class ZooModel:
    build: Callable[[], nn.Module]
    step: Callable[[nn.Module, int, torch.device], torch.Tensor]  # returns the loss of one batch
    samples: Callable[[int], float]  # samples per step for a batch size


def _cnn(name: str, size: int) -> ZooModel:
    def build():
        tvm = vision_models()  # SpeechperfError when torchvision is absent: the row says so
        kw = {"aux_logits": True, "init_weights": False} if name == "inception_v3" else {}
        return getattr(tvm, name)(weights=None, **kw)

    def step(model, b, dev):
        out = model(torch.randn(b, 3, size, size, device=dev))
        logits = out.logits if hasattr(out, "logits") else out
        return F.cross_entropy(logits, torch.randint(0, 1000, (b,), device=dev))
    return ZooModel(build, step, float)


def _lstm_step(model, b, dev):
    tokens = torch.randint(0, 10_000, (b, 21), device=dev)
    logits = model(tokens[:, :-1])  # (B, 20, V)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))


def _transformer_step(model, tokens, dev):
    b = max(1, tokens // 512)  # batch size counts tokens, sequences of 512
    src = torch.randint(0, 37_000, (b, 512), device=dev)
    tgt = torch.randint(0, 37_000, (b, 513), device=dev)
    logits = model(src, tgt[:, :-1])
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), tgt[:, 1:].reshape(-1))


ZOO: dict[str, ZooModel] = {
    "resnet50": _cnn("resnet50", 224),
    "inception_v3": _cnn("inception_v3", 299),
    "vgg16": _cnn("vgg16", 224),
    "lstm": ZooModel(LSTMLanguageModel, _lstm_step, float),
    "transformer": ZooModel(TransformerMT, _transformer_step, lambda tokens: float(max(1, tokens // 512) * 512)),
}
for _name in acoustic.names():  # every registered acoustic model, through the model contract
    ZOO.setdefault(_name, ZooModel(lambda name=_name: acoustic.build(name), acoustic.step, float))


def _outside_models(models: list[str] | None) -> list[str] | None:
    """``models`` with each ``MODULE:NAME`` (a model outside the package) imported, checked
    against the model contract (exit 2 otherwise), added to ZOO and named by its ``NAME``."""
    out = []
    for name in models or ():
        if ":" in name:
            name = acoustic.resolve(name)
            ZOO.setdefault(name, ZooModel(lambda name=name: acoustic.build(name), acoustic.step, float))
        out.append(name)
    return out or None


def parameter_millions(model: nn.Module) -> float:
    return sum(p.numel() for p in model.parameters()) / 1e6


def measure(name: str, model: nn.Module, batch: int, precision: str, dev: torch.device, m: "timing.Method") -> dict:
    """One Table 8 row's measurement of training steps (telemetry.timing: warm-up until stable,
    a timed window without synchronizing on CUDA, repeats, power over the window)."""
    spec = ZOO[name]
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler("cuda", enabled=precision == "amp" and dev.type == "cuda")
    amp = "fp32" if precision == "fp32" else ("fp16" if dev.type == "cuda" else "bf16")

    def one():
        with autocast(dev, amp):
            loss = spec.step(model, batch, dev)
        opt.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()

    out = timing.measure(one, dev, m, spec.samples(batch))
    del out["times"]
    return out


def _model_rows(name: str, batches: list[int], precisions, device: str, m, store, bar, flops: dict,
                rows: list[dict]) -> None:
    """One model's rows appended to ``rows`` and stored, each the moment it is measured (an
    interrupted sweep keeps them); a model that cannot be built here, one row saying why."""
    try:
        model = ZOO[name].build().to(device).train()
    except SpeechperfError as e:
        rows.append(_row(name, None, None, device, None, None, f"skipped: {e}"))
        store.add(rows[-1])
        bar.update(len(batches) * len(precisions))
        return
    dev, params = torch.device(device), parameter_millions(model)
    for batch in batches:
        for precision in precisions:
            bar.set_postfix_str(f"{name} batch {batch} {precision}")
            row = _measured_row(name, model, batch, precision, dev, m, params)
            if name in acoustic.names() and row["status"] == "ok":  # MFU beside samples/s
                row.update(acoustic.mfu_columns(name, model, batch, row["step_s"], dev, row["multiply"], flops))
            rows.append(row)
            store.add(row)
            bar.update(1)


def run_zoo(models=None, batches=None, precisions=("fp32",), device: str = "cpu", iters: int | None = None,
            db_path=None, csv_path=None, warmup: int | None = None, seconds: float | None = None,
            warmup_seconds: float | None = None, repeats: int | None = None, energy_min_seconds: float | None = None,
            progress: bool = True) -> list[dict]:
    """Rows (samples/s, W, J/sample) per model, batch size and precision.

    The method (telemetry.timing) is the device's default with any of ``iters``, ``warmup``
    (warm-up steps at least), ``seconds`` (timed window), ``warmup_seconds``, ``repeats``
    and ``energy_min_seconds`` replaced. With ``db_path`` every row goes to table
    ``bench_zoo`` the moment it is measured (an interrupted sweep keeps what it measured)
    and the Table 8 layout to a CSV (``csv_path``, default ``bench_zoo_table8.csv`` beside
    the database). A progress bar goes to stderr.
    """
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise SpeechperfError(f"device {device!r} requested but no CUDA device is available")
    models = _outside_models(models)
    unknown = set(models or []) - set(ZOO)
    if unknown:
        raise SpeechperfError(f"unknown zoo models {sorted(unknown)}; known: {', '.join(ZOO)}")
    m = timing.method("zoo", device, iters=iters, warmup_steps=warmup, seconds=seconds, warmup_seconds=warmup_seconds,
                      repeats=repeats, energy_min_seconds=energy_min_seconds)
    names = models or list(ZOO)
    plan = {name: list(batches or TABLE8_BATCHES.get(name) or acoustic.batches(device)) for name in names}
    rows: list[dict] = []
    flops: dict = {}  # each acoustic model's FLOP model, fitted once
    store = SweepStore(db_path, "bench_zoo", ZOO_SCHEMA, _row("lstm", 1, "fp32", device, 1.0, None))
    bar = tqdm(total=sum(len(b) * len(precisions) for b in plan.values()), desc="bench zoo", unit="row",
               file=sys.stderr, disable=not progress, dynamic_ncols=True)
    try:
        for name in names:
            _model_rows(name, plan[name], precisions, device, m, store, bar, flops, rows)
    finally:
        bar.close()
        store.close()
        if rows and (csv_path or db_path):
            write_csv(Path(csv_path) if csv_path else Path(db_path).with_name("bench_zoo_table8.csv"), table8(rows))
    return rows


def _measured_row(name: str, model: nn.Module, batch: int, precision: str, dev: torch.device, m, params) -> dict:
    """One row: measured, or why not. A precision this device cannot run for this model is not
    tried ("unsupported on this CPU: ..."); one it only emulates is measured and flagged."""
    device = str(dev)
    can = support(dev, math_types(precision, device)[0], model)
    if not can.runs:
        return _row(name, batch, precision, device, params, None, can.note)  # the status says why
    try:
        row = _row(name, batch, precision, device, params, measure(name, model, batch, precision, dev, m))
    except (torch.cuda.OutOfMemoryError, MemoryError) as e:
        row = _row(name, batch, precision, device, params, None, f"out of memory: {in_words(e)}")
    except RuntimeError as e:
        row = _row(name, batch, precision, device, params, None, f"failed: {in_words(e)}")
    finally:
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    return {**row, "precision_note": can.note}


def notes(rows: list[dict]) -> list[str]:
    """What the text table leaves out: the power source, precisions this device only emulates,
    and every row not measured, with why."""
    lines = sorted({f"power: {r['energy']}" for r in rows if r.get("energy")})
    lines += list(dict.fromkeys(f"{r['precision']} on {r['device']}: {r['precision_note']}" for r in rows
                                if r.get("precision_note") and r["status"] == "ok"))
    lines += list(dict.fromkeys(f"MFU: {r['mfu_note']}" if r.get("mfu_note") else f"MFU ({r['multiply']}): peak "
                                f"{r['peak_source']}" for r in rows if r["status"] == "ok" and
                                (r.get("mfu_note") or r.get("peak_source"))))
    lines += ([f"threads {sorted({r['threads'] for r in rows})}, {rows[0]['libraries']}, torch {rows[0]['torch']}"]
              if rows else [])
    lines += timing.noisy_notes(rows, lambda r: f"{r['model']} batch {r['batch']} {r['precision']}")
    return lines + [f"not measured: {r['model']} batch {r['batch']} {r['precision']}: {r['status']}"
                    for r in rows if r["status"] != "ok"]


def table8(rows: list[dict]) -> list[dict]:
    """Paper 002 Table 8 layout: one line per device, model and batch; PERF (samples/s),
    POW (W) and NRG (J/sample) per precision side by side."""
    lines: dict[tuple, dict] = {}
    for r in rows:
        key = (r["device"], r["model"], r["batch"])
        line = lines.setdefault(key, {"device": r["device"], "model": r["model"], "batch": r["batch"],
                                      "unit": r["unit"], "status": []})
        p = r["precision"] or "-"
        line[f"PERF_{p}"], line[f"POW_{p}"], line[f"NRG_{p}"] = r["samples_per_s"], r["power_w"], r["joules_per_sample"]
        if r["status"] != "ok":
            line["status"].append(f"{p}: {r['status']}")
    return [{**v, "status": "; ".join(v["status"]) or "ok"} for v in lines.values()]


def math_types(precision: str, device: str) -> tuple[str, str]:
    """(multiply, accumulate) types of the matrix products: autocast runs them in fp16 on
    CUDA and bf16 on CPU, accumulating in fp32; fp32 is fp32 throughout (no TF32 here)."""
    if precision == "fp32":
        return "fp32", "fp32"
    return ("fp16" if device.startswith("cuda") else "bf16"), "fp32"


def _row(name, batch, precision, device, params, m, status="ok") -> dict:
    multiply, accumulate = math_types(precision, device) if precision else (None, None)
    return {"model": name, "batch": batch, "precision": precision, "multiply": multiply, "accumulate": accumulate,
            "device": device, "libraries": libraries(torch.device(device)),
            "params_m": round(params, 2) if params else None, "paper_params_m": PAPER_PARAMS_M.get(name),
            "unit": UNITS.get(name, "utterances"), "samples_per_s": m and m["samples_per_s"],
            "step_s": m and m["step_s"],
            "iters": m and m["iters"], "spread_pct": m and m["spread_pct"],
            **{k: (m or {}).get(k) for k in timing.TIMING_COLUMNS},
            "power_w": m and m["power_w"], "joules_per_sample": m and m["joules_per_sample"],
            "energy": m and m["energy"], "torch": torch.__version__, "threads": torch.get_num_threads(),
            "precision_note": None, **dict.fromkeys(acoustic.MFU_COLUMNS), "status": status}


ZOO_SCHEMA = schema.BENCH_ZOO  # every table's DDL lives in results/schema.py


def _store(rows: list[dict], db_path) -> None:
    """Rows measured elsewhere into ``bench_zoo`` as one sweep."""
    store = SweepStore(db_path, "bench_zoo", ZOO_SCHEMA, rows[0] if rows else {})
    for row in rows:
        store.add(row)
    store.close()
