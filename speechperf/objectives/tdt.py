"""The transducer objective's TDT half (Token-and-Duration Transducer, Xu et al. 2023, Parakeet-TDT's
head): a transducer whose ``model.durations`` is set has a joint of V token logits then one logit per
duration, trained by the TDT loss (``objectives/tdt_loss.py``) and decoded by :func:`greedy_tdt`.
``objectives/transducer.py`` calls :func:`head_loss`, :func:`impossible` and :func:`decode` for
every transducer, so the loop never asks which head it trains; a plain RNN-T (no durations) goes
to the RNN-T loss and search as before, unchanged.

Decoding: :func:`greedy_tdt` (batched, on the device): at each step every utterance's joint at its
own frame pointer gives a token (argmax over V) and a duration (argmax over the durations); a
label is emitted and the prediction network steps; the pointer advances by the duration, a blank by
at least 1 (a blank of duration 0 would repeat the same step), and after ``max_symbols`` labels at
one frame by at least 1 (NeMo's rule). The final evaluation's beam search (``train.eval.decoder`` "beam",
width > 1) is :func:`~speechperf.objectives.tdt_search.tdt_beam_search`: one utterance at a time,
its hypotheses' alignments merged, exact on the loss's paths.
"""
from __future__ import annotations

import torch

from speechperf.models.rnnt import BLANK, durations_of
from speechperf.objectives.rnnt_loss import rnnt_loss
from speechperf.objectives.tdt_loss import possible, tdt_loss
from speechperf.objectives.tdt_search import tdt_beam_search
from speechperf.objectives.transducer_search import _where, beam_tokens, greedy_batch


def head_loss(core, logits, targets, out_lens, label_lens) -> torch.Tensor:
    """(B,) per-utterance loss of the joint's ``logits`` (B, T', U+1, V[+D]): TDT where the model has
    durations (with ``model.tdt_sigma`` and ``model.tdt_omega``), else RNN-T; inf where an utterance has
    no path."""
    ds, cfg = durations_of(core.cfg), core.cfg
    if not ds:
        return rnnt_loss(logits, targets, out_lens, label_lens, blank=BLANK, reduction="none")
    loss = tdt_loss(logits, targets, out_lens, label_lens, ds, blank=BLANK, reduction="none", sigma=cfg.tdt_sigma)
    if not cfg.tdt_omega:
        return loss
    # NeMo's omega: the RNN-T loss of the token logits (the durations' ignored), mixed in
    rnnt = rnnt_loss(logits[..., : cfg.num_classes], targets, out_lens, label_lens, blank=BLANK, reduction="none")
    return (1.0 - cfg.tdt_omega) * loss + cfg.tdt_omega * rnnt


def impossible(core, out_lens: torch.Tensor, label_lens: torch.Tensor) -> int:
    """Utterances with no path, from CPU lengths (no device read): no frames; for a TDT without
    duration 0, also more labels than frames - 1."""
    ds = durations_of(core.cfg)
    if not ds:
        return int((out_lens < 1).sum())
    return int((~possible(out_lens, label_lens, ds)).sum())


def decode(core, out, out_lens, decoder: str, beam: int) -> list[list[int]]:
    """Token ids per utterance: the TDT's searches where the model has durations, else RNN-T's."""
    ds = durations_of(core.cfg)
    if ds and (decoder == "greedy" or beam <= 1):
        return greedy_tdt(core, out, out_lens, ds)
    if ds:
        return [tdt_beam_search(core, out[b, : int(out_lens[b])], ds, beam=beam) for b in range(len(out_lens))]
    if decoder == "greedy" or beam <= 1:
        return greedy_batch(core, out, out_lens)
    return beam_tokens(core, out, out_lens, beam=beam)


def greedy_tdt(model, enc: torch.Tensor, out_lens: torch.Tensor, durations, max_symbols: int = 5,
               stop_early: bool | None = None) -> list[list[int]]:
    """Greedy TDT search of a batch: enc (B, T', J), ``out_lens`` (B,) CPU lengths -> the tokens of each
    utterance. ``stop_early`` (default: on a CPU) ends once every pointer passed its frames (a host
    read per step); off, the host reads the device once, at the end, after the bound of
    frames x (max_symbols + 1) steps (each step advances a pointer or emits at most max_symbols at one
    frame). The tokens are the same either way."""
    b, device = enc.shape[0], enc.device
    stop_early = device.type == "cpu" if stop_early is None else stop_early
    frames = int(out_lens.max()) if b else 0
    V = model.cfg.num_classes
    lens = out_lens.to(device, non_blocking=True)
    dur = torch.tensor(durations, dtype=torch.long, device=device)  # (D,)
    rows = torch.arange(b, device=device)
    g, state = model.predict_step(torch.full((b,), BLANK, dtype=torch.long, device=device), None)  # (B, J)
    tokens = torch.zeros(b, frames * max_symbols + 1, dtype=torch.long, device=device)
    count = torch.zeros(b, dtype=torch.long, device=device)
    t = torch.zeros(b, dtype=torch.long, device=device)  # each utterance's frame pointer
    here = torch.zeros(b, dtype=torch.long, device=device)  # labels emitted at the pointer's frame
    for _ in range(frames * (max_symbols + 1)):
        active = t < lens
        if stop_early and not bool(active.any()):
            break
        logits = model.joint(enc[rows, t.clamp(max=max(frames - 1, 0))], g)  # (B, V + D)
        k, d = logits[:, :V].argmax(-1), dur[logits[:, V:].argmax(-1)]
        emit = active & (k != BLANK)
        d = torch.where(~emit | (here + 1 >= max_symbols), d.clamp(min=1), d)  # a blank or the cap: move on
        tokens.scatter_(1, count[:, None], torch.where(emit, k, BLANK)[:, None])
        count += emit
        g_new, state_new = model.predict_step(k, state)
        g, state = torch.where(emit[:, None], g_new, g), _where(emit, state_new, state)
        t = torch.where(active, t + d, t)
        here = torch.where(d > 0, 0, here + emit)
    tokens, count = tokens.cpu(), count.cpu()
    return [tokens[i, : int(count[i])].tolist() for i in range(b)]
