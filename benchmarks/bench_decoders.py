"""Decoder speed and accuracy on identical log-prob matrices, side by side in one process.

Matrices: T = 400 frames x 30 symbols spelling sentences of the embedded corpus's grammar,
``peaked`` (confident, few confusions) and ``noisy`` (flat, confusable emissions). The
reference for ``beam`` is pyctcdecode without LM (install it for the benchmark only:
``pip install pyctcdecode``); ``wordbeam`` uses the bigram LM built from 2,000 sentences
of the same grammar. Prints ms per utterance, CER and the ratio ours / theirs per width.
Usage: python benchmarks/bench_decoders.py [--utts 10] [--widths 16,64,256]
"""
from __future__ import annotations

import argparse
import time

import numpy as np

from speechperf.corpus.sentences import SentenceGenerator
from speechperf.data import alphabet
from speechperf.decode.beam import BeamDecoder
from speechperf.decode.lm import BigramLM, count
from speechperf.decode.wordbeam import WordBeamDecoder
from speechperf.metrics.errors import error_rates


def emissions(text: str, T: int, noise: float, rng) -> np.ndarray:
    """A (T, 30) log-softmax matrix whose frames follow ``text`` with blanks, plus noise."""
    labels = alphabet.encode(text)
    per = T / (2 * len(labels) + 1)
    path = np.zeros(T, dtype=int)
    for i, lab in enumerate(labels):
        path[int((2 * i + 1) * per): int((2 * i + 2) * per)] = lab
    x = rng.standard_normal((T, alphabet.NUM_SYMBOLS)) * noise
    x[np.arange(T), path] += 5.0
    confuse = rng.random(T) < (0.15 if noise > 1 else 0.02)  # a plausible wrong symbol gets mass
    x[np.flatnonzero(confuse), rng.integers(1, 28, confuse.sum())] += 4.5
    return x - np.log(np.exp(x).sum(1, keepdims=True))


def timed(decode, mats) -> tuple[float, list[str]]:
    decode(mats[0])
    t = time.perf_counter()
    out = [decode(m) for m in mats]
    return 1000 * (time.perf_counter() - t) / len(mats), out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--utts", type=int, default=10)
    ap.add_argument("--widths", default="16,64,256")
    a = ap.parse_args()
    gen = SentenceGenerator(5, min_words=8, max_words=12)
    uni, bi = count(gen.sentence() for _ in range(2000))
    lm = BigramLM(dict(uni), {k: dict(v) for k, v in bi.items()})
    refs = [gen.sentence() for _ in range(a.utts)]
    rng = np.random.default_rng(0)
    try:
        from pyctcdecode import build_ctcdecoder

        theirs = build_ctcdecoder([""] + list(alphabet.SYMBOLS[1:-1]) + ["_"])
    except ImportError:
        theirs = None
        print("pyctcdecode not installed: reference columns empty (pip install pyctcdecode)")
    for kind, noise in (("peaked", 0.5), ("noisy", 1.5)):
        mats = [emissions(r, 400, noise, rng) for r in refs]
        for width in [int(w) for w in a.widths.split(",")]:
            ms, hyp = timed(BeamDecoder(width).decode, mats)
            line = f"{kind:6} width {width:4}  beam {ms:8.1f} ms CER {error_rates(refs, hyp).cer:5.2f}"
            if theirs is not None:
                ms_t, hyp_t = timed(lambda m: theirs.decode(m, beam_width=width).replace("_", ""), mats)
                line += f" | pyctcdecode {ms_t:8.1f} ms CER {error_rates(refs, hyp_t).cer:5.2f} | ours/theirs time {ms / ms_t:.2f}"
            print(line)
            ms_w, hyp_w = timed(WordBeamDecoder(lm, width, mode="ngrams").decode, mats)
            print(f"{kind:6} width {width:4}  wordbeam (ngrams) {ms_w:8.1f} ms CER {error_rates(refs, hyp_w).cer:5.2f} "
                  f"WER {error_rates(refs, hyp_w).wer:5.2f}")


if __name__ == "__main__":
    main()
