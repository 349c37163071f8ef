"""The beam search's width cut (decode/kernel.py ``_select``) against its plain definition: keep
the candidates above the larger of the beam-th best score and the best less the gap, then ties
at that cut in candidate order, up to the width. The kernel looks for the beam-th best among the
scores within the gap only; these cases hold ties, gaps that keep fewer or more than the width,
no gap, and candidates at -inf."""
import numpy as np
import pytest

from speechperf.decode.kernel import NEG_INF, _select, log_add


def plain(scores: np.ndarray, beam: int, gap: float) -> list[int]:
    """The candidates kept, by the definition (what the kernel computed before it looked within the gap)."""
    nc = len(scores)
    cut = NEG_INF if nc <= beam else np.partition(scores, nc - beam)[nc - beam]
    cut = max(cut, scores.max() - gap)
    kept = [k for k in range(nc) if scores[k] > cut]
    kept += [k for k in range(nc) if scores[k] == cut][: beam - len(kept)]
    return kept[:beam]


@pytest.mark.parametrize("seed", range(40))
def test_the_cut_keeps_what_its_definition_keeps(seed):
    rng = np.random.default_rng(seed)
    nc, beam = int(rng.integers(1, 300)), int(rng.integers(1, 80))
    gap = [np.inf, 20.0, 3.0, 0.5][seed % 4]
    # scores on a coarse grid (ties), some candidates impossible (-inf), spread wider than the gap
    c_pb = np.round(rng.normal(-30, 8, nc)) / 2
    c_pnb = np.full(nc, NEG_INF)
    c_pb[rng.random(nc) < 0.1] = NEG_INF
    c_pb[0] = max(c_pb[0], -20.0)  # at least one possible candidate
    c_id = np.arange(nc, dtype=np.int32)
    lm = np.zeros(nc)
    b_id, b_pb, b_pnb = np.zeros(beam, np.int32), np.zeros(beam), np.zeros(beam)
    nb = _select(c_id, c_pb, c_pnb, nc, lm, lm, 1.0, beam, gap, b_id, b_pb, b_pnb, np.empty(nc), np.empty(nc))
    scores = np.array([log_add(a, b) for a, b in zip(c_pb, c_pnb)])
    assert list(b_id[:nb]) == plain(scores, beam, gap)
