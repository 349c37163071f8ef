"""The evaluation's scoring against the path it replaced, in one process, on one split's worth of pairs.

Goal: scoring an evaluation (the error rates and the per-utterance counts the bootstrap
resamples; train/evaluate.py's ``score`` without intervals, as the training loop calls it on
the TTA clock) costs a small share of the evaluation. The reference: the same outputs the
way speechperf computed them before (jiwer's corpus-level WER, which builds every word
alignment, beside the rapidfuzz distances counted twice). Both must give the same WER and
CERs; the script refuses to print a ratio where they do not.

Pairs: ``--utts`` (default 1,627, the demo's dev-clean) sentences of the embedded corpus's
grammar, each hypothesis the reference with ``--cer`` % of its characters replaced, dropped
or inserted (a model early in training: 30; near the target: 5). Timing: a warm-up call, then
the median (min-max) of ``--repeats`` calls each.

Usage: python benchmarks/bench_scoring.py [--utts 1627] [--cer 5,30] [--repeats 7]
"""
from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

from rapidfuzz.distance import Levenshtein

sys.path.insert(0, str(Path(__file__).parent))
from _timing import measure  # noqa: E402

from speechperf.corpus.sentences import SentenceGenerator  # noqa: E402
from speechperf.scoring.error_rates import utterance_errors  # noqa: E402
from speechperf.train.evaluate import score  # noqa: E402


def pairs(n: int, cer: float, seed: int = 0) -> tuple[list[str], list[str]]:
    """``n`` corpus sentences and hypotheses with about ``cer`` % of their characters wrong."""
    gen, rng = SentenceGenerator(seed), random.Random(seed)
    refs = [gen.sentence() for _ in range(n)]
    letters = "abcdefghijklmnopqrstuvwxyz '"
    hyps = []
    for r in refs:
        out = []
        for c in r:
            x = rng.random() * 100
            if x >= cer:
                out.append(c)
            elif x < cer / 3:
                out.append(rng.choice(letters))  # substituted
            elif x < 2 * cer / 3:
                out.append(c + rng.choice(letters))  # a character inserted after it
        hyps.append(" ".join("".join(out).split()))  # normalized, as the decoders return text
    return refs, hyps


def reference_score(refs: list[str], hyps: list[str]) -> dict:
    """What speechperf computed before: jiwer's WER, the character distances, then the per-utterance counts again."""
    import jiwer

    edits = sum(Levenshtein.distance(r, h) for r, h in zip(refs, hyps))
    rates = {"wer": 100.0 * jiwer.wer(refs, hyps), "cer": 100.0 * edits / sum(len(r) for r in refs),
             "cer_paper": 100.0 * edits / sum(max(len(r), len(h)) for r, h in zip(refs, hyps))}
    return {**rates, "errors": utterance_errors(refs, hyps)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--utts", type=int, default=1627)
    p.add_argument("--cer", default="5,30", help="comma-separated hypothesis CERs (%%)")
    p.add_argument("--repeats", type=int, default=7)
    a = p.parse_args(argv)
    print(f"{a.utts} pairs; median (min-max) ms of {a.repeats} calls after one warm-up")
    print(f"{'CER %':>6}{'score (ms)':>24}{'reference (ms)':>24}{'reference / score':>20}")
    for cer in (float(c) for c in a.cer.split(",")):
        refs, hyps = pairs(a.utts, cer)
        got, expected = score(refs, hyps, intervals=False), reference_score(refs, hyps)
        for k in ("wer", "cer", "cer_paper"):
            if abs(got[k] - expected[k]) > 1e-9:
                print(f"{k} differs: {got[k]!r} against the reference's {expected[k]!r}", file=sys.stderr)
                return 1
        ours = measure(lambda: score(refs, hyps, intervals=False), a.repeats)
        ref = measure(lambda: reference_score(refs, hyps), a.repeats)
        cell = lambda m: f"{1e3 * m['median']:.1f} ({1e3 * m['min']:.1f}-{1e3 * m['max']:.1f})"  # noqa: E731
        print(f"{got['cer']:>6.1f}{cell(ours):>24}{cell(ref):>24}{ref['median'] / ours['median']:>19.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
