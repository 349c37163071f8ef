"""Decoder speed and accuracy on identical log-prob matrices, side by side in one process.

Matrices: T = 400 frames x 30 symbols whose best path spells a sentence of the embedded
corpus's grammar (2,400-word vocabulary): every label holds 2-4 frames with 0-3 blank
frames after it, the rest of the 400 frames are blanks split between start and end.
``peaked``: the path symbol dominates, 2% of frames give mass to a wrong letter.
``noisy``: a weaker peak, heavier Gaussian noise, 20% of frames confused with a wrong
letter or a space (greedy CER about 30%). The dictionary and bigram LM (lm.py smoothing) come from 2,000
training sentences of the same grammar; the flashlight decoder gets the same LM as ARPA.
References (install for the benchmark only): pyctcdecode without LM for ``beam``, and
flashlight-text's lexicon decoder + KenLM (same bigram) for ``wordbeam`` (NGrams mode).
``--run DIR`` adds the emissions of a trained model (e.g. the demo's ``DEMO/run``) on its
dev-clean and dev-other splits, decoded with that run's own dictionary and LM: the realistic
case (the synthetic matrices are no model's posteriors: on ``noisy`` greedy beats every
search that sums alignments, pyctcdecode included).
Per utterance times: one warm-up utterance, then the median (min-max) over utterances.
Usage: python benchmarks/bench_decoders.py [--utts 30] [--widths 16,64,256] [--run DEMO/run]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from speechperf.corpus.sentences import SentenceGenerator
from speechperf.corpus import alphabet
from speechperf.decode.beam import BeamDecoder
from speechperf.decode.greedy import GreedyDecoder
from speechperf.decode.lm import BigramLM, count, write_arpa
from speechperf.decode.wordbeam import WordBeamDecoder
from speechperf.scoring.error_rates import error_rates

T = 400
KINDS = {"peaked": dict(peak=8.0, noise=0.5, confuse=0.02, strength=5.0),
         "noisy": dict(peak=5.0, noise=0.8, confuse=0.20, strength=4.0)}


def emissions(text: str, rng, peak: float, noise: float, confuse: float, strength: float) -> np.ndarray:
    """A (T, 30) log-softmax matrix following ``text`` (see the module docstring)."""
    path: list[int] = []
    for lab in alphabet.encode(text):
        path += [lab] * int(rng.integers(2, 5)) + [alphabet.BLANK] * int(rng.integers(0, 4))
    lead = (T - len(path)) // 2
    full = np.zeros(T, dtype=np.int64)
    full[lead: lead + len(path)] = path  # (T,) frame labels, blanks around
    x = rng.standard_normal((T, alphabet.NUM_SYMBOLS)) * noise  # (T, 30) logits
    x[np.arange(T), full] += peak
    hit = np.flatnonzero(rng.random(T) < confuse)
    x[hit, rng.integers(1, 28, hit.size)] += strength  # a wrong letter or a space gains mass
    return x - np.log(np.exp(x).sum(1, keepdims=True))


def sentences(gen: SentenceGenerator, n: int) -> list[str]:
    """``n`` sentences whose frame paths fit into T (at most T / 4.5 labels)."""
    out: list[str] = []
    while len(out) < n:
        s = gen.sentence()
        if len(alphabet.encode(s)) <= T / 4.5:
            out.append(s)
    return out


def timed(decode, mats) -> tuple[float, float, float, list[str]]:
    """(median, min, max) ms per utterance and the outputs."""
    decode(mats[0])  # warm-up (numba cache load, LM state allocation)
    ts, out = [], []
    for m in mats:
        t = time.perf_counter()
        out.append(decode(m))
        ts.append(1000 * (time.perf_counter() - t))
    return statistics.median(ts), min(ts), max(ts), out


def row(name: str, refs, result) -> str:
    med, lo, hi, hyp = result
    r = error_rates(refs, hyp)
    return f"{name:34} {med:8.1f} ms ({lo:6.1f}-{hi:7.1f})  CER {r.cer:5.2f}  WER {r.wer:5.2f}"


def references(lm: BigramLM, folder: Path):
    """(pyctcdecode decoder or None, flashlight factory or None), with a note when missing."""
    try:
        from pyctcdecode import build_ctcdecoder

        pyctc = build_ctcdecoder(["", " ", *alphabet.SYMBOLS[2:]])
    except ImportError:
        pyctc = None
        print("pyctcdecode not installed: no beam reference (pip install pyctcdecode)")
    try:
        from speechperf.decode.flashlight import FlashlightDecoder

        write_arpa(lm, folder / "lm.arpa")
        flash = lambda width: FlashlightDecoder(folder / "lm.arpa", width)  # noqa: E731
    except ImportError:
        flash = None
        print("flashlight-text not installed: no wordbeam reference (pip install flashlight-text)")
    return pyctc, flash


def model_emissions(run: Path, splits=("dev-clean", "dev-other")) -> dict[str, tuple[list, list[str]]]:
    """Log-probs of a trained run's checkpoint (e.g. the demo's) on its validation splits:
    {split: (list of (T_i, 30) arrays, transcripts)}, T_i the model's output lengths."""
    import torch

    from speechperf.studies.evaluate_run import load_run_model
    from speechperf.data.batching import Batching
    from speechperf.train.evaluate import eval_batches

    model, cfg, feats, _ = load_run_model(run)
    model.eval()
    out = {}
    for split in splits:
        mats, refs = [], []
        with torch.no_grad():
            for b in eval_batches(feats, split, Batching(cfg.loader)):  # the evaluation's batches
                lp, lens = model(b.feats, b.feat_lens)  # (T', B, 30), (B,)
                lp = lp.float().numpy().astype(np.float64)
                mats += [np.ascontiguousarray(lp[: int(lens[i]), i]) for i in range(lp.shape[1])]
                refs += list(b.transcripts)
        out[f"model {split}"] = (mats, refs)
    return out, feats


def compare(kind: str, mats, refs, widths, lm, pyctc, flash) -> None:
    """Greedy, then per width: beam vs pyctcdecode, wordbeam (two modes) vs flashlight."""
    print(f"\n== {kind} ({len(mats)} utterances, T median {int(np.median([m.shape[0] for m in mats]))}): "
          + row("greedy", refs, timed(GreedyDecoder().decode, mats)))
    for width in widths:
        ours = timed(BeamDecoder(width).decode, mats)
        print(row(f"beam {width}", refs, ours))
        if pyctc is not None:
            theirs = timed(lambda m: pyctc.decode(m, beam_width=width).replace("_", ""), mats)
            print(row(f"pyctcdecode {width} (no LM)", refs, theirs) + f"  ours/theirs time {ours[0] / theirs[0]:.3f}"
                  + f"  CER ours-theirs {error_rates(refs, ours[3]).cer - error_rates(refs, theirs[3]).cer:+.2f}")
        ours = {m: timed(WordBeamDecoder(lm, width, mode=m).decode, mats) for m in ("ngrams", "ngrams_forecast")}
        theirs = timed(flash(width).decode, mats) if flash is not None else None
        for mode, result in ours.items():
            ratio = ""
            if theirs:
                ratio = (f"  ours/theirs time {result[0] / theirs[0]:.3f}"
                         f"  CER ours-theirs {error_rates(refs, result[3]).cer - error_rates(refs, theirs[3]).cer:+.2f}")
            print(row(f"wordbeam {width} {mode}", refs, result) + ratio)
        if theirs:
            print(row(f"flashlight {width} (KenLM bigram)", refs, theirs))
    sys.stdout.flush()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--utts", type=int, default=30)
    ap.add_argument("--widths", default="16,64,256")
    ap.add_argument("--run", default=None, help="a trained run (e.g. DEMO/run): also decode its model's emissions")
    a = ap.parse_args()
    widths = [int(w) for w in a.widths.split(",")]
    gen = SentenceGenerator(5, min_words=8, max_words=12)
    uni, bi = count(sentences(gen, 2000))
    lm = BigramLM(dict(uni), {k: dict(v) for k, v in bi.items()})
    refs = sentences(gen, a.utts)
    rng = np.random.default_rng(0)
    pyctc, flash = references(lm, Path(tempfile.mkdtemp(prefix="bench-decoders-")))
    words = [w for r in refs for w in r.split()]
    oov = sum(w not in set(lm.words) for w in words)
    print(f"{len(lm.words)} dictionary words, {sum(map(len, lm.bigrams.values()))} bigrams, {a.utts} utterances; "
          f"{oov} of {len(words)} reference words are out of the dictionary (no lexicon decoder can spell them: "
          f"on peaked matrices these are all the errors)")
    for kind, params in KINDS.items():
        compare(kind, [emissions(r, rng, **params) for r in refs], refs, widths, lm, pyctc, flash)
    if a.run:
        from speechperf.decode.lm import load_lm

        kinds, feats = model_emissions(Path(a.run))
        run_lm = load_lm(feats)  # the run's own dictionary and bigram, as its evaluation uses
        _, run_flash = references(run_lm, Path(tempfile.mkdtemp(prefix="bench-decoders-run-")))
        for kind, (mats, run_refs) in kinds.items():
            compare(kind, mats, run_refs, widths, run_lm, pyctc, run_flash)


if __name__ == "__main__":
    main()
