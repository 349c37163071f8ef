"""The per-epoch evaluation's seconds on a prepared split: the decoder pool against the
one-core path it replaces, in the same process, on the same model and batches.

Reference (``old``): what the training loop ran every epoch before the pool: the decoder and
its dictionary/LM tables built anew, each batch decoded one utterance at a time in the main
thread right after its forward pass, the bootstrap intervals computed inside the evaluation.
``new``: :func:`speechperf.train.evaluate.evaluate` as the loop calls it: the decoder built
once (before the clock), each batch's decode submitted to N threads while the next batches'
forward passes run, the intervals computed after it (off the clock, timed apart here). Both
give the same texts (checked here, tested in tests/decode/test_pool.py).

Resident batches (``--part resident``): the loop's path with the evaluation split's batches read
from the shards at every evaluation (``stream``, the reference: readers started, shards
decompressed, batches padded) against the same path on the batches kept resident since the
run's initialization (:func:`speechperf.train.evaluate.keep_resident`); the results must be equal.

Batch loop (``--part sync``): the loop that read every batch's loss (a boolean-mask index and two
host reads) and copied its log-probs back (``.cpu()``) right after its forward pass, four waits for
the device per batch (``synced_evaluate``, the reference, kept here), against
:func:`speechperf.train.evaluate.evaluate`, whose loop reads nothing back (pending pinned copies
for the decode threads, the losses computed and read after the loop). Both on the resident
batches, interleaved; the losses and texts must be equal (bit for bit on the CPU). On a CPU
expect about 1.00x: the host is the device, there is no queue to keep full; the gain is on a
GPU (``--device cuda``), where the old loop drained the queue after every batch.

Evaluation batches (``--part batches``): the pass on training-sized batches (the reference:
``loader.eval_max_duration`` 0) against evaluation-sized ones (the preset's or run's
``eval_max_duration``, or ``--eval-max-duration``), both kept resident as a run keeps them:
batches, padded / valid frames, the batches' longest output x the model's layers (a cuDNN LSTM
launches kernels per time step per layer: on a GPU, where the pass is launch-bound, the
launches scale with it; an estimate, not a count), the forward seconds and the evaluation's
(with the decode wait after the forward passes and the decode threads' share of a core). The results must
agree (``same_results``: fp32 on a CPU exactly but the loss's summation order; bf16 or a GPU to
its numerics). On a CPU expect little: its forward pass is compute-bound.

Also the decode alone on log-probs computed once: frames per second per thread with 1 and N
threads (N threads sharing cores with each other and the machine's other work), and the
evaluation's share of a TTA whose evaluation share was ``--share`` under the old path.

Model: ``--run DIR`` (a run folder's latest checkpoint: realistic beam behaviour) or, without
it, a randomly initialized model of ``--preset`` (says so). Usage:
  python benchmarks/bench_eval.py --feats /work/data/feats [--run RUN] [--threads N] [--repeats 2]
  [--torch-threads 1] [--part all|pool|resident|sync|batches] [--device cpu|cuda] [--eval-max-duration S]
"""
from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path

import torch

from speechperf.config import RunConfig, load_preset
from speechperf.data.batching import Batching
from speechperf.data.loader import load_index
from speechperf.decode import get_decoder
from speechperf.cpus import usable_cpus
from speechperf.decode.batch import DecodePool
from speechperf.models import build_model
from speechperf.models.contract import autocast, planned_forward, unwrap
from speechperf.results import checkpoint
from speechperf.results.run import Run
from speechperf.train import evaluate as ev
from speechperf.train.warmup import warm_decoder

CPU = torch.device("cpu")


@torch.no_grad()
def old_evaluate(model, feats: Path, split: str, cfg: RunConfig) -> tuple[float, list[str]]:
    """The one-core path (the reference): (seconds, texts)."""
    tc = cfg.train
    start = time.perf_counter()
    model.eval()
    dec = get_decoder(tc.eval_decoder, beam=tc.eval_beam, features=feats,
                      mode=tc.eval_mode if tc.eval_decoder == "wordbeam" else None)  # rebuilt every epoch
    index = load_index(feats, [split])
    refs, hyps, ids = [], [], []
    for batch in ev.eval_batches(feats, split, Batching(cfg.loader), index):
        log_probs, out_lens = planned_forward(model, batch.feats, batch.feat_lens, CPU)
        log_probs = log_probs.float()  # (T', B, C)
        torch.nn.functional.ctc_loss(log_probs, batch.labels, out_lens, batch.label_lens, blank=0, reduction="none")
        hyps += dec.decode_batch(log_probs.numpy(), out_lens.numpy(), workers=0)
        refs += list(batch.transcripts)
        ids += list(batch.ids)
    refs, hyps = ev.by_id(ids, refs, hyps)  # scored in id order, as the evaluation scores
    ev.score(refs, hyps, intervals=True)
    return time.perf_counter() - start, hyps


def new_evaluate(model, feats: Path, split: str, cfg: RunConfig, threads: int) -> tuple[dict, float]:
    """The loop's path with ``threads`` decode threads: (its result, the intervals' seconds)."""
    tc = cfg.train
    r = ev.evaluate(model, feats, split, Batching(cfg.loader), CPU, decoder=tc.eval_decoder, beam=tc.eval_beam,
                    workers=threads, mode=tc.eval_mode, keep_pairs=1_000_000, intervals=False)
    t = time.perf_counter()
    ev.with_intervals(r)
    return r, time.perf_counter() - t


@torch.no_grad()
def emissions(model, feats: Path, split: str, cfg: RunConfig) -> list[tuple]:
    """Every batch's (T', B, C) log-probs and lengths, computed once."""
    index = load_index(feats, [split])
    out = []
    for batch in ev.eval_batches(feats, split, Batching(cfg.loader), index):
        log_probs, out_lens = planned_forward(model, batch.feats, batch.feat_lens, CPU)
        out.append((log_probs.float().numpy(), out_lens.numpy()))
    return out


def decode_rate(dec, batches: list, threads: int) -> tuple[float, float]:
    """(wall seconds, frames per second per thread) of decoding ``batches`` on ``threads``."""
    t = time.perf_counter()
    with DecodePool(dec, threads) as pool:
        for lp, lens in batches:
            pool.submit(lp, lens)
        pool.results()
        frames = pool.frames
    wall = time.perf_counter() - t
    return wall, frames / wall / threads


TIMES = ("eval_s", "eval_forward_s", "eval_decode_s", "eval_score_s", "eval_data", "decode_busy_s", "decode_cpu_s")


def resident_vs_stream(model, feats: Path, split: str, cfg: RunConfig, threads: int, repeats: int) -> int:
    """Per-evaluation seconds, streamed against resident, interleaved; 1 if the results differ."""
    tc = cfg.train
    t = time.perf_counter()
    kept = ev.keep_resident(feats, split, Batching(cfg.loader), CPU, tc.eval_resident_mb)
    built = time.perf_counter() - t
    if kept is None:
        print(f"{split}'s batches exceed train.eval_resident_mb={tc.eval_resident_mb}: nothing to compare")
        return 1
    print(f"\nresident batches: {len(kept.batches)} batches, {kept.nbytes / 2**20:.1f} MiB padded float32 "
          f"({kept.where}), built in {built:.2f} s at initialization (outside the clock)")
    runs: dict[str, list[dict]] = {"stream": [], "resident": []}
    for _ in range(repeats):  # interleaved: the machine's other load hits both alike
        for name in ("stream", "resident"):
            saved = dict(ev._RESIDENT)
            if name == "stream":
                ev.release_resident()
            r, _ = new_evaluate(model, feats, split, cfg, threads)
            ev._RESIDENT.update(saved)
            runs[name].append(r)
    ref = min(runs["stream"], key=lambda r: r["eval_s"])
    print(f"per-evaluation seconds (min of {repeats}), {threads} decode threads:")
    for name, rs in runs.items():
        r = min(rs, key=lambda r: r["eval_s"])
        print(f"  {name} ({r['eval_data']}): {r['eval_s']:.2f} s ({ref['eval_s'] / r['eval_s']:.2f}x): forward "
              f"{r['eval_forward_s']:.2f} s ({ref['eval_forward_s'] / r['eval_forward_s']:.2f}x), decode wait "
              f"{r['eval_decode_s']:.2f} s, score {r['eval_score_s']:.3f} s")
    a, b = (ev.with_intervals(runs[name][0]) for name in runs)  # the per-utterance counts, as the intervals
    if {k: v for k, v in a.items() if k not in TIMES} != {k: v for k, v in b.items() if k not in TIMES}:
        print("FAILED: the resident evaluation's result differs from the streamed one's", file=sys.stderr)
        return 1
    print("results equal: loss, every metric and interval, every decoded text")
    return 0


def old_planned_forward(model, x, lengths, device):
    """The reference's forward: CPU tensors moved from pageable memory (may wait for the queue)."""
    out_lens, kw = unwrap(model).plan(lengths, x.shape[1])
    kw = {k: v.to(device, non_blocking=True) for k, v in kw.items()}
    log_probs, _ = model(x.to(device, non_blocking=True), lengths.to(device, non_blocking=True), **kw)
    return log_probs, out_lens


@torch.no_grad()
def synced_evaluate(model, feats: Path, split: str, cfg: RunConfig, device, threads: int) -> dict:
    """The reference of ``--part sync``: evaluate's path (decoder, pool, resident batches,
    scoring without intervals) with the batch loop that waited for the device after every batch."""
    tc, start = cfg.train, time.perf_counter()
    model.eval()
    dec = ev.make_decoder(tc.eval_decoder, tc.eval_beam, feats, tc.eval_mode)
    index = load_index(feats, [split])
    kept = ev._RESIDENT.get(ev._resident_key(feats, split, index, Batching(cfg.loader), device))
    batches = kept.batches if kept is not None else ev.eval_batches(feats, split, Batching(cfg.loader), index)
    refs, ids, loss_sum, n_loss = [], [], 0.0, 0
    with DecodePool(dec, threads) as pool:
        for batch in batches:
            with autocast(device, tc.precision):
                log_probs, out_lens = old_planned_forward(model, batch.feats, batch.feat_lens, device)
            log_probs = log_probs.float()  # (T', B, C)
            losses = torch.nn.functional.ctc_loss(log_probs, batch.labels.to(device, non_blocking=True), out_lens,
                                                  batch.label_lens, blank=0, reduction="none", zero_infinity=False)
            finite = torch.isfinite(losses)
            loss_sum += float(losses[finite].sum())  # waits for this batch's forward pass and loss
            n_loss += int(finite.sum())
            pool.submit(log_probs.cpu().numpy(), out_lens.numpy())
            refs += list(batch.transcripts)
            ids += list(batch.ids)
        forward = time.perf_counter() - start
        hyps = pool.results()
    refs, hyps = ev.by_id(ids, refs, hyps)  # scored in id order, as the evaluation scores
    ev.score(refs, hyps, intervals=False)
    return {"eval_s": time.perf_counter() - start, "eval_forward_s": forward, "loss": loss_sum / max(n_loss, 1),
            "hyps": hyps}


def loop_vs_synced(model, feats: Path, split: str, cfg: RunConfig, device, threads: int, repeats: int) -> int:
    """Per-evaluation seconds of the synced loop (the reference) and evaluate's, interleaved on
    the resident batches; 1 if their losses or texts differ."""
    tc = cfg.train
    model.to(device)
    kept = ev.keep_resident(feats, split, Batching(cfg.loader), device, tc.eval_resident_mb)
    runs: dict[str, list[dict]] = {"synced": [], "evaluate": []}
    for i in range(repeats + 1):  # the first round warms both up (cuDNN, the pinned pool) and is not kept
        synced = synced_evaluate(model, feats, split, cfg, device, threads)
        r = ev.evaluate(model, feats, split, Batching(cfg.loader), device, decoder=tc.eval_decoder, beam=tc.eval_beam,
                        workers=threads, precision=tc.precision, mode=tc.eval_mode, keep_pairs=1_000_000,
                        intervals=False)
        if i:
            runs["synced"].append(synced)
            runs["evaluate"].append({**r, "hyps": [q["hyp"] for q in r["pairs"]]})
    ref = min(runs["synced"], key=lambda r: r["eval_s"])
    print(f"\nbatch loop on {device} ({kept.where if kept else 'stream'} batches), {threads} decode threads, "
          f"{tc.precision}; per-evaluation seconds (min of {len(runs['synced'])}), {len(ref['hyps'])} utterances:")
    for name, rs in runs.items():
        r = min(rs, key=lambda r: r["eval_s"])
        print(f"  {name}: {r['eval_s']:.3f} s ({ref['eval_s'] / r['eval_s']:.2f}x), forward {r['eval_forward_s']:.3f} s "
              f"({ref['eval_forward_s'] / r['eval_forward_s']:.2f}x)")
    a, b = runs["synced"][0], runs["evaluate"][0]
    exact = torch.device(device).type == "cpu"
    same_loss = a["loss"] == b["loss"] if exact else abs(a["loss"] - b["loss"]) <= 1e-6 * abs(a["loss"])
    if not (same_loss and a["hyps"] == b["hyps"]):
        print(f"FAILED: the loops differ: loss {a['loss']!r} vs {b['loss']!r}, texts equal: {a['hyps'] == b['hyps']}",
              file=sys.stderr)
        return 1
    print(f"results equal: loss ({'bit for bit' if exact else 'to 1e-6'}) {b['loss']:.6f}, every decoded text")
    return 0


def batch_shapes(model, feats: Path, split: str, loader) -> dict:
    """The evaluation's batches of ``split`` under ``loader``: their count, padded / valid frames
    and the sum over batches of the longest output length (the model's time steps per layer)."""
    index = load_index(feats, [split])
    plan = ev.eval_batches(feats, split, Batching(loader), index).plan
    longest = [int(index.frames[b].max()) for b in plan.batches]
    steps = unwrap(model).output_lengths(torch.tensor(longest)).sum()
    padded = sum(len(b) * m for b, m in zip(plan.batches, longest))
    return {"batches": len(plan), "padded": padded / float(index.frames.sum()), "steps": int(steps)}


def eval_vs_train_sized(model, feats: Path, split: str, cfg: RunConfig, device, threads: int, repeats: int) -> int:
    """Per-evaluation seconds (the forward pass, the decode wait after it, the scoring) on
    training-sized batches (the reference) and on the evaluation-sized ones
    (``loader.eval_max_duration``), each kept resident as the run keeps them, interleaved; 1 if
    the losses, metrics or texts differ. Fewer batches cut a launch-bound forward pass, but the
    last batch's decode starts only when the forward passes end: the evaluation's seconds say
    which wins."""
    tc, model = cfg.train, model.to(device)
    sized = {"training-sized": replace(cfg.loader, eval_max_duration=0.0), "eval-sized": cfg.loader}
    layers = getattr(unwrap(model).cfg, "lstm_layers", None) or getattr(unwrap(model).cfg, "layers", 1)
    print(f"\nevaluation batches of {split} (loader.max_duration={cfg.loader.max_duration:g}, "
          f"eval_max_duration={cfg.loader.eval_max_duration:g}) on {device}, {tc.precision}, {threads} decode threads:")
    runs: dict[str, list[dict]] = {name: [] for name in sized}
    for i in range(repeats + 1):  # the first round warms both up (shapes' plans, the pinned pool) and is not kept
        for name, loader in sized.items():
            ev.keep_resident(feats, split, Batching(loader), device, max(tc.eval_resident_mb, 1))  # built outside the timing
            r = ev.evaluate(model, feats, split, Batching(loader), device, decoder=tc.eval_decoder, beam=tc.eval_beam,
                            workers=threads, precision=tc.precision, mode=tc.eval_mode, keep_pairs=1_000_000,
                            intervals=False)
            if i:
                runs[name].append(r)
    ev.release_resident()
    ref = None
    for name, loader in sized.items():
        shape, best = batch_shapes(model, feats, split, loader), min(runs[name], key=lambda r: r["eval_s"])
        ref = ref or (shape, best)
        share = 100 * best["decode_cpu_s"] / best["decode_busy_s"] if best["decode_busy_s"] > 0 else float("nan")
        print(f"  {name}: {shape['batches']} batches, padded / valid frames {shape['padded']:.3f}, "
              f"batches' longest output x layers {shape['steps']} x {layers} = {shape['steps'] * layers} "
              f"({ref[0]['steps'] / shape['steps']:.2f}x fewer); forward {best['eval_forward_s']:.3f} s "
              f"({ref[1]['eval_forward_s'] / best['eval_forward_s']:.2f}x), evaluation {best['eval_s']:.3f} s "
              f"({ref[1]['eval_s'] / best['eval_s']:.2f}x: decode wait {best['eval_decode_s']:.3f} s, score "
              f"{best['eval_score_s']:.3f} s; decode threads {share:.0f}% of a core), {best['eval_data']} batches "
              f"(the fastest evaluation of {repeats})")
    print("  (estimate: a cuDNN LSTM launches its kernels per time step per layer, so a GPU's launches scale "
          "with the longest output x layers; a CPU's forward pass is compute-bound)")
    exact = torch.device(device).type == "cpu" and tc.precision == "fp32"
    return same_results(*(runs[name][0] for name in sized), exact)


def same_results(a: dict, b: dict, exact: bool) -> int:
    """0 where two evaluations of one split in other batches agree, else 1 saying what differs.
    The (reference, text) pairs as a multiset (both in utterance-id order; the intervals are
    not compared: bf16 or a GPU may change a text) and every point metric: equal where
    ``exact`` (fp32 on a CPU), the loss to 1e-6 (sums in another order); elsewhere (bf16, a GPU's kernels chosen
    per shape) the loss to 1e-3 and at most 1% of the texts may differ."""
    pairs = [Counter((p["ref"], p["hyp"]) for p in r["pairs"]) for r in (a, b)]
    texts = sum((pairs[0] - pairs[1]).values())
    skip = TIMES + ("loss", "errors", "pairs")
    points = [{k: v for k, v in r.items() if k not in skip and not k.endswith(("_lo", "_hi"))} for r in (a, b)]
    loss = abs(a["loss"] - b["loss"]) / abs(a["loss"])
    ok = loss <= 1e-6 and texts == 0 and points[0] == points[1] if exact else \
        loss <= 1e-3 and texts <= 0.01 * len(a["pairs"])
    print(f"  results {'equal' if ok else 'DIFFER'}: loss {a['loss']:.6f} vs {b['loss']:.6f} (relative {loss:.1e}), "
          f"{texts} of {len(a['pairs'])} texts differ, cer {a.get('cer')} vs {b.get('cer')}"
          + ("" if exact else " (bf16 or GPU: numerics per batch shape, tolerances 1e-3 and 1%)"))
    if not ok:
        print("FAILED: the evaluation-sized batches' result differs from the training-sized batches'", file=sys.stderr)
    return 0 if ok else 1


def load_model(args) -> tuple[torch.nn.Module, RunConfig, str]:
    if args.run:
        run = Run.open(Path(args.run), data=Path(args.feats))
        ckpt = checkpoint.load(run.folder)
        cfg = RunConfig.from_dict(ckpt[checkpoint.CONFIG])
        model = build_model(cfg.model)
        model.load_state_dict(ckpt[checkpoint.MODEL])
        prog = ckpt[checkpoint.PROGRESS]
        return model, cfg, f"run {args.run} ({prog['epoch'] - 1} epochs + {prog['start_batch']} batches trained)"
    cfg = load_preset(args.preset)
    torch.manual_seed(0)
    return build_model(cfg.model), cfg, f"randomly initialized {args.preset} preset (untrained: beam behaviour not realistic)"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--feats", default="/work/data/feats")
    p.add_argument("--run", default=None, help="a run folder: its latest checkpoint is the model")
    p.add_argument("--preset", default="cpu", help="without --run: a random model of this preset")
    p.add_argument("--split", default="dev-clean")
    p.add_argument("--threads", type=int, default=usable_cpus(), help="the pool's size for 'all threads'")
    p.add_argument("--repeats", type=int, default=2, help="evaluations per path (the minimum is shown)")
    p.add_argument("--share", type=float, default=9.8, help="the evaluation's percent of the TTA under the old path")
    p.add_argument("--torch-threads", type=int, default=0,
                   help="torch intra-op threads of the forward pass (0: torch's default; 1 on a loaded machine, "
                        "where two spinning OpenMP threads cost more than they give)")
    p.add_argument("--part", choices=("all", "pool", "resident", "sync", "batches"), default="all",
                   help="pool: the decode pool against the one-core path; resident: kept batches against streamed "
                        "ones; sync: evaluate's batch loop against the one that waited for the device every batch; "
                        "batches: evaluation-sized batches against training-sized ones")
    p.add_argument("--device", default="cpu", help="the device of --part sync and batches (cuda: where their gain is)")
    p.add_argument("--eval-max-duration", type=float, default=None,
                   help="--part batches: loader.eval_max_duration to compare (default: the preset's or run's)")
    args = p.parse_args(argv)
    if args.repeats < 1:
        p.error(f"--repeats must be at least 1, got {args.repeats}")
    if args.eval_max_duration is not None and args.eval_max_duration <= 0:
        p.error(f"--eval-max-duration must be > 0 (padded seconds per evaluation batch), got {args.eval_max_duration}")
    if args.torch_threads:
        torch.set_num_threads(args.torch_threads)
    feats = Path(args.feats)
    model, cfg, what = load_model(args)
    tc = cfg.train
    print(f"model: {what}; {args.split} of {feats}; decoder {tc.eval_decoder} beam {tc.eval_beam} ({tc.eval_mode}); "
          f"usable CPUs {usable_cpus()}, torch threads {torch.get_num_threads()}")
    t = time.perf_counter()
    warm_decoder(tc.eval_decoder, tc.eval_beam, feats, tc.eval_mode)  # the run's initialization (compiles, builds once)
    print(f"initialization (decoder built, kernels compiled): {time.perf_counter() - t:.2f} s, outside the clock")
    t = time.perf_counter()
    get_decoder(tc.eval_decoder, beam=tc.eval_beam, features=feats, mode=tc.eval_mode)
    print(f"decoder + LM tables rebuilt (what every old evaluation paid): {time.perf_counter() - t:.3f} s")
    if args.part == "resident":
        return resident_vs_stream(model, feats, args.split, cfg, args.threads, args.repeats)
    if args.part == "batches":
        if args.eval_max_duration is not None:
            cfg = replace(cfg, loader=replace(cfg.loader, eval_max_duration=args.eval_max_duration))
        if cfg.loader.eval_max_duration <= 0:
            p.error(f"--part batches: {what} has loader.eval_max_duration=0 (training-sized evaluation batches): "
                    "name one with --eval-max-duration")
        return eval_vs_train_sized(model, feats, args.split, cfg, torch.device(args.device), args.threads, args.repeats)
    if args.part == "sync":
        return loop_vs_synced(model, feats, args.split, cfg, torch.device(args.device), args.threads, args.repeats)

    old, new1, newN, texts = [], [], [], {}
    for _ in range(args.repeats):  # interleaved: the machine's other load hits every path alike
        s, texts["old"] = old_evaluate(model, feats, args.split, cfg)
        old.append(s)
        for threads, kept in ((1, new1), (args.threads, newN)):
            r, iv = new_evaluate(model, feats, args.split, cfg, threads)
            kept.append((r, iv))
            texts[threads] = [q["hyp"] for q in r["pairs"]]
    if not texts["old"] == texts[1] == texts[args.threads]:
        print("FAILED: the paths decoded different texts", file=sys.stderr)
        return 1
    ref = min(old)
    print(f"\nper-epoch evaluation seconds (min of {args.repeats}), {len(texts['old'])} utterances:")
    print(f"  old (one core, decoder rebuilt, intervals inside): {ref:.2f} s  (1.00x)")
    for label, kept in (("new, 1 thread", new1), (f"new, {args.threads} threads", newN)):
        r, iv = min(kept, key=lambda x: x[0]["eval_s"])
        print(f"  {label}: {r['eval_s']:.2f} s  ({ref / r['eval_s']:.2f}x faster): forward {r['eval_forward_s']:.2f} s, "
              f"decode wait {r['eval_decode_s']:.2f} s, score {r['eval_score_s']:.3f} s; intervals off the clock {iv:.3f} s")
    best = min(r["eval_s"] for r, _ in newN)
    ratio = best / ref
    s = args.share / 100
    print(f"\nevaluation share of a TTA whose evaluation was {args.share:.1f}% under the old path: "
          f"{100 * ratio * s / (1 - s + ratio * s):.1f}% (the evaluation {ratio:.2f}x as long, the rest unchanged)")

    dec = ev.make_decoder(tc.eval_decoder, tc.eval_beam, feats, tc.eval_mode)
    t = time.perf_counter()
    batches = emissions(model, feats, args.split, cfg)
    print(f"\nforward alone (loading, forward; no decode): {time.perf_counter() - t:.2f} s")
    print("decode alone (log-probs computed once):")
    one = decode_rate(dec, batches, 1)
    print(f"  1 thread: {one[0]:.2f} s, {one[1]:,.0f} frames/s per thread")
    many = decode_rate(dec, batches, args.threads)
    print(f"  {args.threads} threads: {many[0]:.2f} s, {many[1]:,.0f} frames/s per thread "
          f"({one[0] / many[0]:.2f}x the 1-thread wall)")
    if args.part == "all" and resident_vs_stream(model, feats, args.split, cfg, args.threads, args.repeats):
        return 1
    return loop_vs_synced(model, feats, args.split, cfg, CPU, args.threads, args.repeats) if args.part == "all" else 0


if __name__ == "__main__":
    sys.exit(main())
