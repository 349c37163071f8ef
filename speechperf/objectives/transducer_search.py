"""Decoding a transducer (speechperf/models/rnnt.py): batched greedy search on the device
for the per-epoch evaluation, and a beam search for the final one.

Both read the model through four calls only: ``predict_step(tokens (B,), state) -> (g (B, J),
state)`` (state None: the start; the blank is fed first), ``joint(enc, g) -> logits``, and a
state that is a tuple of tensors with the batch in dimension 0 (so states are selected and
merged without knowing the predictor). Any number of output units; the blank is 0.

**Greedy** (:func:`greedy_batch`): every utterance of the batch advances frame by frame
together; at each frame up to ``max_symbols`` symbols, each the joint's argmax; a prediction
step for the whole batch after each, kept (``torch.where``) only where a non-blank was emitted.
On a GPU the host reads the device once per batch (the tokens at the end): the loop's bounds
come from the CPU lengths, so all ``frames x max_symbols`` steps run even where no utterance
emits. On a CPU, where a read costs nothing, a frame's steps stop once no utterance emitted
(the same tokens, fewer steps).

**Beam search** (:func:`beam_search`): alignment-length synchronous decoding (ALSD, Saon,
Hoang, Tüske & Kurata 2020) with a cap of ``max_symbols`` symbols per frame. Why ALSD and not
icefall's modified beam search (one symbol per frame): character units on a 6x LSTM encoder
(60 ms frames) or an 8x Conformer need more than one symbol on many frames (the synthesized
corpus has ~5 input frames per character), which a one-symbol-per-frame search cannot emit at
all; ALSD emits several, as greedy search does. Each step extends every hypothesis by one
symbol or one blank (a blank moves it to the next frame), so all hypotheses of a step share
``frames + symbols``; the candidates of a step that are one sequence at one frame (a blank
after ``y``, and ``y``'s last symbol after its prefix a frame later) are merged with their
probabilities log-added before the best ``beam`` are kept; a hypothesis that passes its last
frame is final. Beam 1 is greedy search with the same ``max_symbols``. A batch of utterances
is searched together (:func:`beam_batch`): each step, every utterance's hypotheses share one
joint call and one prediction step, and the host reads the step's scores once; the choice of
each utterance's best ``beam`` (its merges, its top-k) stays per utterance, on the host, so an
utterance's hypotheses are those it gets alone (tested). The one-utterance search of the
final evaluation took a Python loop of model calls per utterance; the batch makes a
per-epoch beam affordable (`python benchmarks/run.py transducer_beam`).
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import torch

BLANK = 0
State = tuple[torch.Tensor, ...]


def _where(mask: torch.Tensor, new: State, old: State) -> State:
    """Per batch row (mask (B,) bool): ``new``'s row where True, else ``old``'s."""
    return tuple(torch.where(mask.view(-1, *[1] * (n.dim() - 1)), n, o) for n, o in zip(new, old))


def _rows(state: State, index: torch.Tensor) -> State:
    return tuple(s.index_select(0, index) for s in state)


def greedy_batch(model, enc: torch.Tensor, out_lens: torch.Tensor, max_symbols: int = 5,
                 stop_early: bool | None = None) -> list[list[int]]:
    """Greedy search of a batch: enc (B, T', J) the model's forward output, ``out_lens`` (B,) its
    CPU lengths -> the tokens (no blanks) of each utterance. ``stop_early`` (default: on a CPU)
    ends a frame's steps once no utterance emitted, one host read per step; off, the host reads
    the device once, at the end. The tokens are the same either way."""
    b, device = enc.shape[0], enc.device
    stop_early = device.type == "cpu" if stop_early is None else stop_early
    frames = int(out_lens.max()) if b else 0  # a CPU tensor: no device read
    lens = out_lens.to(device, non_blocking=True)
    g, state = model.predict_step(torch.full((b,), BLANK, dtype=torch.long, device=device), None)  # (B, J)
    tokens = torch.zeros(b, frames * max_symbols + 1, dtype=torch.long, device=device)  # room for every emission
    count = torch.zeros(b, dtype=torch.long, device=device)  # tokens emitted so far, per utterance
    for t in range(frames):
        active = lens > t  # (B,): utterances still inside their frames
        for _ in range(max_symbols):
            k = model.joint(enc[:, t], g).argmax(-1)  # (B, J) -> (B, V) -> (B,)
            emit = active & (k != BLANK)
            tokens.scatter_(1, count[:, None], torch.where(emit, k, BLANK)[:, None])  # at the first free slot
            count += emit
            g_new, state_new = model.predict_step(k, state)
            g, state = torch.where(emit[:, None], g_new, g), _where(emit, state_new, state)
            active = emit  # a blank (or the cap) ends an utterance's frame
            if stop_early and not bool(active.any()):
                break
    tokens, count = tokens.cpu(), count.cpu()  # the host's read of the device
    return [tokens[i, : int(count[i])].tolist() for i in range(b)]


@dataclass(frozen=True)
class Hypothesis:
    """One beam entry: its tokens, log-probability (merged paths log-added), the frame it reads
    next and the symbols it emitted at that frame. Its place in the beam's list is its row in
    the step's g and state tensors."""

    tokens: tuple[int, ...]
    score: float
    frame: int
    symbols: int = 0


def _logadd(a: float, b: float) -> float:
    hi, lo = max(a, b), min(a, b)
    return hi if lo == -math.inf else hi + math.log1p(math.exp(lo - hi))


def _merge_into_blanks(hyps: list[Hypothesis], scores: torch.Tensor) -> None:
    """In place on ``scores`` (K, V): a blank after hypothesis H and H's last symbol after its
    prefix P one frame later are one candidate (H's tokens at H's frame + 1): its score the
    log-sum of both, kept in H's blank column; P's column for that symbol is dropped."""
    at = {(h.tokens, h.frame): k for k, h in enumerate(hyps)}
    for k, h in enumerate(hyps):
        p = at.get((h.tokens[:-1], h.frame + 1)) if h.tokens else None
        if p is not None:
            v = h.tokens[-1]
            scores[k, BLANK] = torch.logaddexp(scores[k, BLANK], scores[p, v])
            scores[p, v] = -math.inf


def _advance(model, picks: list[tuple[Hypothesis, int, int]], g: torch.Tensor, state: State,
             frames: int | list[int]) -> tuple[list[Hypothesis], list[Hypothesis], torch.Tensor, State]:
    """The picked hypotheses (each with its parent's row in ``g`` and ``state`` and the unit it
    emitted, BLANK for none): those past the last frame (final), the others with their g and state
    rows (one batched prediction step for the emitted units; a blank keeps its parent's rows). The
    ALSD below and the TDT's search (tdt_search.py) both step their beams through it."""
    emitted = [(k, v) for _, k, v in picks if v != BLANK]
    if emitted:
        parents = torch.tensor([k for k, _ in emitted], device=g.device)
        units = torch.tensor([v for _, v in emitted], device=g.device)
        g_new, state_new = model.predict_step(units, _rows(state, parents))
        g_all = torch.cat((g, g_new))  # (K + N, J): the old rows, then the new ones
        state_all = tuple(torch.cat(pair) for pair in zip(state, state_new))
    else:
        g_all, state_all = g, state
    final, active, rows, new = [], [], [], g.shape[0]
    ends = frames if isinstance(frames, list) else [frames] * len(picks)
    for (hyp, k, v), end in zip(picks, ends):
        row, new = (k, new) if v == BLANK else (new, new + 1)
        if hyp.frame >= end:
            final.append(hyp)
        else:
            active.append(hyp)
            rows.append(row)
    index = torch.tensor(rows, dtype=torch.long, device=g.device)
    return final, active, g_all.index_select(0, index), _rows(state_all, index)


def _merge_finals(finals: dict[tuple[int, ...], Hypothesis], ended: list[Hypothesis]) -> None:
    """In place: ``ended`` into ``finals`` (one per token sequence, its paths' probabilities log-added)."""
    for h in ended:
        old = finals.get(h.tokens)
        finals[h.tokens] = h if old is None else Hypothesis(h.tokens, _logadd(old.score, h.score), h.frame)


def _extend(hyps: list[Hypothesis], k: int, v: int, score: float) -> tuple[Hypothesis, int, int]:
    """ALSD's extension of ``hyps[k]`` by unit ``v``: a blank moves to the next frame, a symbol stays."""
    h = hyps[k]
    if v == BLANK:
        return Hypothesis(h.tokens, score, h.frame + 1), k, v
    return Hypothesis(h.tokens + (v,), score, h.frame, h.symbols + 1), k, v


def _scores(model, flat_enc: torch.Tensor, at: list[int], hyps: list[Hypothesis], g: torch.Tensor,
            max_symbols: int) -> torch.Tensor:
    """(K, V) scores on the host of every one-unit extension of ``hyps`` (rows of every utterance),
    -inf where the cap forbids a symbol: ``at`` each one's row in ``flat_enc`` (B*T', J)."""
    device = flat_enc.device
    logp = model.joint(flat_enc.index_select(0, torch.tensor(at, device=device)), g).float().log_softmax(-1)
    scores = (logp + torch.tensor([h.score for h in hyps], device=device)[:, None]).cpu()  # (K, J) -> (K, V)
    capped = torch.tensor([h.symbols >= max_symbols for h in hyps])
    scores[:, BLANK + 1:].masked_fill_(capped[:, None], -math.inf)  # at the cap: only the blank
    return scores


def _best(hyps: list[Hypothesis], scores: torch.Tensor, beam: int, first: int) -> list[tuple[Hypothesis, int, int]]:
    """One utterance's step: its hypotheses' candidates ``scores`` (K, V, merged in place), the best
    ``beam`` finite ones extended; ``first``: its first row in the step's g and state."""
    _merge_into_blanks(hyps, scores)
    flat = scores.flatten()
    top = flat.topk(min(beam, flat.numel()))  # -inf (capped, merged) ones dropped below
    width = scores.shape[1]
    picks = [_extend(hyps, i // width, i % width, s)
             for i, s in zip(top.indices.tolist(), top.values.tolist()) if s > -math.inf]
    return [(h, first + k, v) for h, k, v in picks]


def beam_batch(model, enc: torch.Tensor, out_lens: torch.Tensor, beam: int = 4,
               max_symbols: int = 5) -> list[list[Hypothesis]]:
    """ALSD of a batch: enc (B, T', J) the model's forward output, ``out_lens`` (B,) its CPU lengths
    -> each utterance's final hypotheses, best first (one per token sequence, merged paths
    log-added); none for an utterance without frames. Active hypotheses are rows grouped by
    utterance (``owner``), in the order each utterance's search would keep them alone."""
    b, t_max, device = enc.shape[0], enc.shape[1], enc.device
    ends = [int(n) for n in out_lens.tolist()]
    flat_enc = enc.reshape(b * t_max, -1)  # (B*T', J): utterance u's frame t is row u*T' + t
    owner = [u for u in range(b) if ends[u] > 0]
    g, state = model.predict_step(torch.full((len(owner),), BLANK, dtype=torch.long, device=device), None)
    active, finals = [Hypothesis((), 0.0, 0) for _ in owner], [{} for _ in range(b)]
    while active:
        scores = _scores(model, flat_enc, [u * t_max + h.frame for u, h in zip(owner, active)], active, g,
                         max_symbols)
        picks, pick_owner = [], []
        for u, rows in itertools.groupby(range(len(active)), key=owner.__getitem__):  # each utterance's rows
            rows = list(rows)
            lo, hi = rows[0], rows[-1] + 1
            best = _best(active[lo:hi], scores[lo:hi], beam, lo)
            picks += best
            pick_owner += [u] * len(best)
        _, active, g, state = _advance(model, picks, g, state, [ends[u] for u in pick_owner])
        owner = []  # the owners of the kept rows, in _advance's order (the picks' without the final ones)
        for u, (h, _, _) in zip(pick_owner, picks):
            if h.frame >= ends[u]:
                _merge_finals(finals[u], [h])
            else:
                owner.append(u)
    return [sorted(f.values(), key=lambda h: -h.score) for f in finals]


def beam_hypotheses(model, enc: torch.Tensor, beam: int = 4, max_symbols: int = 5) -> list[Hypothesis]:
    """ALSD of one utterance's encoder output enc (T', J), its valid frames only (``enc[b, :out_lens[b]]``
    of a batch's forward): the final hypotheses, best first (one per token sequence, merged paths
    log-added)."""
    return beam_batch(model, enc[None], torch.tensor([enc.shape[0]]), beam, max_symbols)[0]


def beam_search(model, enc: torch.Tensor, beam: int = 4, max_symbols: int = 5) -> list[int]:
    """The best token sequence (no blanks) of one utterance's encoder output enc (T', J)."""
    hyps = beam_hypotheses(model, enc, beam, max_symbols)
    return list(hyps[0].tokens) if hyps else []


def beam_tokens(model, enc: torch.Tensor, out_lens: torch.Tensor, beam: int = 4, max_symbols: int = 5) -> list[list[int]]:
    """The best token sequence (no blanks) of each utterance of a batch: enc (B, T', J), ``out_lens`` (B,) CPU."""
    return [list(h[0].tokens) if h else [] for h in beam_batch(model, enc, out_lens, beam, max_symbols)]
