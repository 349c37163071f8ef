"""The ratio of two machines' TTAs over seeds, with an exact 95% interval.

Method: the Hodges-Lehmann estimate and the exact Mann-Whitney (distribution-free)
confidence interval of a shift on the log scale (Bauer 1972; R's ``wilcox.test(conf.int=
TRUE)``): the ratio is the median of all seed-pair ratios a_i / b_j, and the interval runs
from the (c+1)-th smallest to the (c+1)-th largest of those ratios, c the largest count
with P(U <= c) <= 2.5% under the exact null distribution of the Mann-Whitney U for these
group sizes. Chosen over a bootstrap because

- it is exact at the handful of seeds TTA studies afford (3-10): a percentile bootstrap
  of 3-5 seeds undercovers (it never looks past the seeds it has) and would call machines
  distinguishable that are not; this interval is honest instead: with too few seeds it is
  unbounded (2 against 2 seeds cannot reach 95%), and the table says so;
- it is deterministic without a random seed, and needs only the ranks, so a seed that
  never reached the target enters as "slower than any TTA" (an infinite TTA) and is never
  dropped: its pair ratios are infinite (or 0 on the other side); a pair where both never
  reached is a tie, put half at 0 and half at infinity (it favours neither side);
- a machine speed-up multiplies TTA, so a shift of log TTA is the model it assumes.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from functools import lru_cache
from typing import Sequence

CONFIDENCE = 0.95


@dataclass(frozen=True)
class RatioInterval:
    """TTA(A) / TTA(B) over seeds."""

    ratio: float | None  # median of the seed-pair ratios (Hodges-Lehmann); None when undefined (both never reached)
    low: float  # lower end of the interval (0.0: unbounded below)
    high: float  # upper end (math.inf: unbounded above)
    coverage: float | None  # the exact coverage achieved (>= 95%), None when no finite interval exists at these sizes

    @property
    def holds_one(self) -> bool:
        """The interval contains 1: these seeds cannot tell the two apart."""
        return self.low <= 1.0 <= self.high


@lru_cache(maxsize=256)
def u_counts(n: int, m: int) -> tuple[int, ...]:
    """How many of the C(n+m, n) equally likely orderings give each Mann-Whitney U = 0..nm:
    the coefficients of the Gaussian binomial [n+m choose n]_q, built as
    prod_i (1 - q^(m+i)) / (1 - q^i) in exact integers."""
    c = [1] + [0] * (n * m)
    for i in range(1, n + 1):
        for j in range(len(c) - 1, m + i - 1, -1):  # times (1 - q^(m+i))
            c[j] -= c[j - m - i]
        for j in range(i, len(c)):  # divided by (1 - q^i)
            c[j] += c[j - i]
    return tuple(c)


def critical_count(n: int, m: int, confidence: float = CONFIDENCE) -> tuple[int | None, float | None]:
    """(c, coverage): the largest c with P(U <= c) <= (1 - confidence) / 2 and the exact
    coverage 1 - 2 P(U <= c) of the interval it gives; (None, None) when even U = 0 is
    likelier than that (too few seeds for this confidence)."""
    counts, total = u_counts(n, m), math.comb(n + m, n)
    tail, below, c = (1 - confidence) / 2, 0, None
    for u, k in enumerate(counts):
        if (below + k) / total > tail + 1e-12:
            break
        below += k
        c = u
    return (None, None) if c is None else (c, 1 - 2 * below / total)


def pair_ratios(a: Sequence[float], b: Sequence[float]) -> list[float]:
    """Every a_i / b_j, sorted; math.inf stands for "never reached" (see the module text)."""
    out, ties = [], 0
    for x in a:
        for y in b:
            if math.isinf(x) and math.isinf(y):
                out.append(0.0 if ties % 2 == 0 else math.inf)
                ties += 1
            elif math.isinf(x) or y == 0:
                out.append(math.inf)
            else:
                out.append(x / y)
    return sorted(out)


def ratio_interval(a: Sequence[float], b: Sequence[float], confidence: float = CONFIDENCE) -> RatioInterval:
    """TTA(A) / TTA(B) from the seeds' TTAs (math.inf: never reached), with its exact interval."""
    if not a or not b:
        raise ValueError("a ratio needs at least one run on each side")
    ratios = pair_ratios(a, b)
    middle = statistics.median(ratios) if not all(map(math.isinf, list(a) + list(b))) else None
    if middle is not None and math.isnan(middle):  # 0 and inf at the middle: no point estimate
        middle = None
    c, coverage = critical_count(len(a), len(b), confidence)
    if c is None:
        return RatioInterval(middle, 0.0, math.inf, None)
    return RatioInterval(middle, ratios[c], ratios[len(ratios) - 1 - c], coverage)
