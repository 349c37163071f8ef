"""The evaluation's batch loop: it reads no device value (the losses are read after it, the
log-probs reach the decode threads as pending host copies), and its result is the per-batch
loop's it replaced, bit for bit on the CPU."""
import math
import threading
import warnings

import numpy as np
import pytest
import torch

from speechperf.config import load_preset
from speechperf.data.batching import Batching
from speechperf.data.loader import load_index
from speechperf.decode.batch import Pending
from speechperf.models import build_model
from speechperf.objectives import ctc
from speechperf.objectives.ctc import ctc_losses
from speechperf.train import evaluate as ev
from tests.cuda_syncs import sync_warnings

CPU = torch.device("cpu")
SPLIT = "dev-clean"


def tiny_model(device=CPU):
    cfg = load_preset("tiny", ["threads=1"])
    torch.manual_seed(0)
    return build_model(cfg.model).to(device), cfg


@torch.no_grad()
def old_loop(model, feats, loader_cfg, device, dec, kernel="numba") -> tuple[float, list[str], list[str]]:
    """The reference: the batch loop as it was, reading each batch's loss and log-probs back
    right after its forward pass and decoding in the calling thread: (loss, refs, hyps), the
    pairs in utterance-id order, as the evaluation scores them; the CTC loss by ``kernel``."""
    model.eval()
    loss_sum, n_loss, refs, hyps, ids = 0.0, 0, [], [], []
    for batch in ev.eval_batches(feats, SPLIT, Batching(loader_cfg), load_index(feats, [SPLIT])):
        log_probs, out_lens = ev.planned_forward(model, batch.feats, batch.feat_lens, device)
        log_probs = log_probs.float()  # (T', B, C)
        losses = ctc_losses(log_probs, batch.labels.to(device), out_lens, batch.label_lens, kernel,
                            zero_infinity=False)  # default: the run's default (train.system.ctc_kernel)
        finite = torch.isfinite(losses)
        loss_sum += float(losses[finite].sum())
        n_loss += int(finite.sum())
        lp = log_probs.cpu().numpy()
        hyps += [dec.decode(np.ascontiguousarray(lp[:n, b])) for b, n in enumerate(out_lens.tolist())]
        refs += list(batch.transcripts)
        ids += list(batch.ids)
    order = np.argsort(np.array(ids), kind="stable")
    return loss_sum / max(n_loss, 1), [refs[i] for i in order], [hyps[i] for i in order]


def run_eval(model, feats, cfg, device=CPU, workers=2):
    return ev.evaluate(model, feats, SPLIT, Batching(cfg.loader), device, decoder="beam", beam=8, workers=workers,
                       keep_pairs=100_000)


def assert_same_as_old(r: dict, old: tuple) -> None:
    """Loss, every metric and interval, every text: equal, not close."""
    loss, refs, hyps = old
    assert r["loss"] == loss
    expected = ev.score(refs, hyps)
    assert {k: r[k] for k in expected} == expected
    assert [p["ref"] for p in r["pairs"]] == refs and [p["hyp"] for p in r["pairs"]] == hyps


@pytest.fixture
def released():
    ev.release_resident()
    yield
    ev.release_resident()


@pytest.mark.parametrize("kept", [False, True], ids=["stream", "resident"])
def test_the_evaluation_equals_the_per_batch_loop_on_the_cpu(tiny_features, released, kept):
    model, cfg = tiny_model()
    if kept:
        assert ev.keep_resident(tiny_features, SPLIT, Batching(cfg.loader), CPU, max_mb=64).where == "host"
    old = old_loop(model, tiny_features, cfg.loader, CPU, ev.make_decoder("beam", 8, tiny_features))
    assert len(set(old[2])) > 1 and math.isfinite(old[0])  # distinct texts: an order mix-up would show
    assert_same_as_old(run_eval(model, tiny_features, cfg), old)


def test_the_mean_loss_leaves_out_impossible_utterances_and_keeps_the_batch_order():
    uniform = torch.full((2, 2, 3), math.log(1 / 3))  # (T'=2, B=2, C=3)
    # utterance 0: label [1] over 2 frames, 3 of the 9 paths ("1 1", "0 1", "1 0"): loss log 3;
    # utterance 1: 3 labels over 2 frames, impossible: inf, left out of the sum and the count
    batch = (uniform, torch.tensor([1, 1, 2, 1]), torch.tensor([2, 2]), torch.tensor([1, 3]))
    assert ev.mean_loss([batch], CPU) == pytest.approx(math.log(3), rel=1e-6)
    none_possible = (uniform, torch.tensor([1, 2, 1, 1, 2, 1]), torch.tensor([2, 2]), torch.tensor([3, 3]))
    assert ev.mean_loss([none_possible, batch], CPU) == pytest.approx(math.log(3), rel=1e-6)
    assert ev.mean_loss([none_possible], CPU) == 0.0
    assert ev.mean_loss([], CPU) == 0.0


# ---- no device read inside the loop ----------------------------------------------------------

_READS = {torch.Tensor.item, torch.Tensor.__float__, torch.Tensor.__int__, torch.Tensor.__bool__,
          torch.Tensor.__index__, torch.Tensor.tolist, torch.Tensor.numpy, torch.Tensor.cpu,
          torch.Tensor.__array__, torch.Tensor.nonzero, torch.nonzero, torch.Tensor.masked_select}


class _Watch:
    """Host reads of the model's outputs (and of everything computed from them) made by the
    evaluating thread between the first forward pass and :func:`mean_loss`."""

    def __init__(self):
        self.on, self.thread, self.reads = False, threading.get_ident(), []

    def seen(self, func, args) -> None:
        if not self.on or threading.get_ident() != self.thread:
            return
        index = args[1] if func is torch.Tensor.__getitem__ else ()
        masked = any(isinstance(i, torch.Tensor) and i.dtype == torch.bool
                     for i in (index if isinstance(index, tuple) else (index,)))  # x[mask]: its size is a read
        if func in _READS or masked:
            self.reads.append(getattr(func, "__name__", str(func)))


WATCH = _Watch()


class _Watched(torch.Tensor):
    """A model output whose host reads :data:`WATCH` records (ops on it return _Watched too)."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        WATCH.seen(func, args)
        return super().__torch_function__(func, types, args, kwargs or {})


class _CopyOnWait:
    """A fake CUDA event: the 'device-to-host copy' into ``dst`` (NaN until then) is made by the
    first decode thread that waits on it, so a decode that read the array early decodes NaN."""

    def __init__(self, src: torch.Tensor, dst: np.ndarray):
        self.src, self.dst, self.guard, self.done = src, dst, threading.Lock(), False

    def synchronize(self):
        with self.guard:
            if not self.done:
                self.dst[...] = self.src.as_subclass(torch.Tensor).numpy()
                self.done = True


def watched(monkeypatch) -> _Watch:
    """evaluate with its model outputs watched, and the CUDA path's pending copies faked."""
    WATCH.__init__()
    real_forward, real_mean = ev.planned_forward, ev.mean_loss

    def forward(*a, **k):
        log_probs, out_lens = real_forward(*a, **k)
        WATCH.on = True
        return log_probs.as_subclass(_Watched), out_lens

    def mean_loss(outputs, device, *rest):  # the loop is over
        WATCH.on = False
        return real_mean(outputs, device, *rest)

    def host_copy(log_probs):
        dst = np.full(tuple(log_probs.shape), np.nan, np.float32)
        return Pending(dst, _CopyOnWait(log_probs, dst))

    monkeypatch.setattr(ev, "planned_forward", forward)
    monkeypatch.setattr(ev, "mean_loss", mean_loss)
    monkeypatch.setattr(ctc, "host_copy", host_copy)  # the CTC objective hands the copies to the pool
    return WATCH


def test_the_batch_loop_reads_no_model_output_and_decodes_pending_copies(tiny_features, released, monkeypatch):
    model, cfg = tiny_model()
    old = old_loop(model, tiny_features, cfg.loader, CPU, ev.make_decoder("beam", 8, tiny_features))
    watch = watched(monkeypatch)
    r = run_eval(model, tiny_features, cfg)
    assert watch.reads == []
    assert_same_as_old(r, old)  # the decodes waited for their copies: no NaN read
    watch.__init__()
    watch.on = True
    old_loop(model, tiny_features, cfg.loader, CPU, ev.make_decoder("beam", 8, tiny_features), kernel="torch")
    assert {"__getitem__", "__float__", "__int__", "cpu"} <= set(watch.reads)  # the watch sees the old reads
    # (torch's CTC returns the watched subclass; the numba kernel's losses are a new tensor)


# ---- CUDA ------------------------------------------------------------------------------------


def _sync_warnings(caught) -> int:
    return len(sync_warnings(caught))


@pytest.mark.cuda
def test_on_cuda_the_batch_loop_never_waits_for_the_device(tiny_features, released, monkeypatch):
    dev = torch.device("cuda", 0)
    model, cfg = tiny_model(dev)
    assert ev.keep_resident(tiny_features, SPLIT, Batching(cfg.loader), dev, max_mb=64).where == "device"
    run_eval(model, tiny_features, cfg, dev)  # warm-up: cuDNN handles, the pinned host pool
    in_loop = []
    real_mean = ev.mean_loss

    def mean_loss(outputs, device, *rest):  # the loop is over: its syncs counted, the rest not
        torch.cuda.set_sync_debug_mode(0)
        in_loop.append(_sync_warnings(caught))
        return real_mean(outputs, device, *rest)

    monkeypatch.setattr(ev, "mean_loss", mean_loss)
    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            r = run_eval(model, tiny_features, cfg, dev)
        finally:
            torch.cuda.set_sync_debug_mode(0)
    assert in_loop == [0]
    loss, refs, hyps = old_loop(model, tiny_features, cfg.loader, dev, ev.make_decoder("beam", 8, tiny_features))
    assert r["loss"] == pytest.approx(loss, rel=1e-6)  # the same device ops, read later
    assert [p["hyp"] for p in r["pairs"]] == hyps


@pytest.mark.cuda
def test_a_cuda_host_copy_is_pinned_and_ready_after_its_event():
    x = torch.randn(50, 3, 30, device="cuda").log_softmax(-1)
    p = ev.host_copy(x)
    assert isinstance(p, Pending) and p.shape == (50, 3, 30)
    np.testing.assert_array_equal(p.get(), x.cpu().numpy())
    assert torch.from_numpy(p.array).is_pinned()
