"""The exact interval of a TTA ratio over seeds, against hand and brute-force computations."""
import itertools
import math

import pytest

from speechperf.scoring.interval import critical_count, pair_ratios, ratio_interval, u_counts


@pytest.mark.parametrize("n,m", [(1, 1), (2, 3), (3, 3), (4, 5), (5, 5)])
def test_u_distribution_is_the_count_over_every_ordering(n, m):
    # brute force: every choice of the n ranks of group A among n + m; U = pairs (a, b) with a after b
    counts = [0] * (n * m + 1)
    for ranks in itertools.combinations(range(n + m), n):
        counts[sum(r - i for i, r in enumerate(ranks))] += 1
    assert list(u_counts(n, m)) == counts


def test_critical_counts_match_the_published_mann_whitney_table():
    # two-sided 5% critical values of U (reject when U <= c): 5,5 -> 2; 10,10 -> 23; 4,4 -> 0
    assert critical_count(5, 5) == (2, pytest.approx(1 - 2 * 4 / 252))
    assert critical_count(10, 10)[0] == 23
    assert critical_count(4, 4)[0] == 0
    assert critical_count(3, 3) == (None, None)  # min p = 2/20: no 95% interval exists


def test_interval_by_hand_for_five_seeds_each():
    a, b = [10, 11, 12, 13, 14], [20, 21, 22, 23, 24]
    ratios = sorted(x / y for x in a for y in b)
    iv = ratio_interval(a, b)
    # c = 2: from the 3rd smallest to the 3rd largest of the 25 pair ratios; estimate: their median
    assert (iv.low, iv.high, iv.ratio) == (ratios[2], ratios[22], ratios[12])
    assert iv.high < 1 and not iv.holds_one


def test_overlapping_seeds_hold_one():
    iv = ratio_interval([10, 12, 14, 16, 18], [11, 13, 15, 17, 19])
    assert iv.holds_one and iv.low < 1 < iv.high


def test_too_few_seeds_give_an_unbounded_interval():
    iv = ratio_interval([1.0, 1.1], [5.0, 5.1])  # A 5x faster, but 2 against 2 seeds cannot reach 95%
    assert (iv.low, iv.high, iv.coverage) == (0.0, math.inf, None) and iv.holds_one


def test_never_reached_is_slower_than_any_tta():
    assert pair_ratios([math.inf], [2.0]) == [math.inf] and pair_ratios([2.0], [math.inf]) == [0.0]
    assert pair_ratios([math.inf, math.inf], [math.inf, math.inf]) == [0.0, 0.0, math.inf, math.inf]  # ties: half each way
    # A twice as fast on four seeds, but its fifth never reached: 5 of the 25 pairs favour B, so
    # five seeds cannot call A faster (dropping the failed seed would have: [0.5, 0.5])
    iv = ratio_interval([5, 5, 5, 5, math.inf], [10, 10, 10, 10, 10])
    assert (iv.ratio, iv.low, iv.high) == (0.5, 0.5, math.inf) and iv.holds_one
