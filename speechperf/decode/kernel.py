"""The compiled CTC beam search shared by ``beam`` and ``wordbeam`` (numba, nogil).

Why compiled: the pure-Python prefix beam search took 3.2 s per 400-frame utterance at
width 256 and the dict-based word beam search 0.85-1.1 s on a 2-core CPU (ledger:
bench_decoders), against a goal of ~64 ms; numpy vectorization does not fit a search whose
candidate set changes every frame, so the loop is compiled with numba.

Every label prefix gets an integer id in a prefix trie built during the search (parent,
last label, and a child row per prefix that ever was a beam), so merging two paths to the
same prefix is an array lookup, not tuple hashing. Each id carries the word-search state
fixed by its labels: the dictionary tree node (-1 between words), the LM history word, the
log LM score of its completed words and the forecast of its partial word. A beam keeps the
two CTC probabilities: of paths ending in blank and of paths ending in its last label.
"""
from __future__ import annotations

import math

import numpy as np
from numba import njit

NEG_INF = -np.inf
MODE_WORDS, MODE_NGRAMS, MODE_FORECAST, MODE_SAMPLE = 0, 1, 2, 3


@njit(cache=True, nogil=True)
def log_add(a, b):
    """log(exp(a) + exp(b)), -inf-safe (the beam searches' and the RNN-T lattice's)."""
    if a == NEG_INF:
        return b
    if b == NEG_INF:
        return a
    if a > b:
        return a + math.log1p(math.exp(b - a))
    return b + math.log1p(math.exp(a - b))


@njit(cache=True, nogil=True)
def _prob(w, h, uni, row_start, row_word, row_disc, backoff):
    """P(w | h) of the interpolated bigram."""
    lo, hi = row_start[h], row_start[h + 1]
    j = lo + np.searchsorted(row_word[lo:hi], w)
    p = backoff[h] * uni[w]
    if j < hi and row_word[j] == w:
        p += row_disc[j]
    return p


@njit(cache=True, nogil=True)
def _forecast(nd, h, mode, samples, node_lo, node_hi, uni, cum_uni, row_start, row_word, row_disc, cum_disc,
              backoff):
    """log of the LM mass of the words below tree node ``nd`` after history ``h``."""
    lo, hi = node_lo[nd], node_hi[nd]
    if mode == MODE_SAMPLE and hi - lo > samples:
        s = 0.0
        for _ in range(samples):  # with replacement: an unbiased estimate of the mass
            s += _prob(np.random.randint(lo, hi), h, uni, row_start, row_word, row_disc, backoff)
        return math.log(s * (hi - lo) / samples)
    r0, r1 = row_start[h], row_start[h + 1]
    a = r0 + np.searchsorted(row_word[r0:r1], lo)
    b = r0 + np.searchsorted(row_word[r0:r1], hi)
    return math.log(backoff[h] * (cum_uni[hi] - cum_uni[lo]) + cum_disc[b] - cum_disc[a])


@njit(cache=True, nogil=True)
def beam_search(lp, beam, log_thresh, score_gap, constrained, mode, lm_weight, samples, space, next_node, node_word,
                node_lo, node_hi, is_non_word, uni, cum_uni, row_start, row_word, row_disc, cum_disc, backoff):
    """(T, C) log-probs -> (labels of the best prefix, ids of its words; -1 if unconstrained).

    ``constrained`` False: plain prefix beam search over all C symbols (the tree and LM
    arguments are ignored). Symbols below ``log_thresh`` in a frame are not tried as
    extensions, and candidates scoring more than ``score_gap`` below the frame's best are
    dropped before the width cut (inf keeps all). The blank is symbol 0.
    ``space`` (-1: none): a space that would lead the text or follow a space is no new
    prefix; its paths are added to the prefix itself, so texts that differ only in runs of
    spaces (the same words after normalization) share one beam instead of splitting their
    probability over several.
    """
    T, C = lp.shape
    V = uni.shape[0]
    if mode == MODE_SAMPLE:
        np.random.seed(0)  # the sampled forecast is the same for the same input
    above = 0
    for t in range(T):
        for c in range(1, C):
            if lp[t, c] >= log_thresh:
                above += 1
    cap = 1 + beam * above  # every (beam, label) pair creates at most one prefix id
    parent = np.empty(cap, np.int32)
    label = np.empty(cap, np.int32)
    row = np.empty(cap, np.int32)  # child-table row, -1 until the prefix is extended
    stamp = np.empty(cap, np.int32)  # frame in which the id last became a candidate
    pos = np.empty(cap, np.int32)  # its candidate slot in that frame
    node = np.empty(cap, np.int32)
    hist = np.empty(cap, np.int32)
    done = np.empty(cap, np.int32)  # word completed by this id's last label, -1 if none
    lm_base = np.empty(cap, np.float64)
    lm_fc = np.empty(cap, np.float64)
    child = np.empty((min(cap, T * beam + 1), C), np.int32)  # rows only for prefixes that were beams
    parent[0], label[0], row[0], stamp[0], node[0], hist[0], done[0] = -1, -1, -1, -1, -1, V, -1
    lm_base[0], lm_fc[0] = 0.0, 0.0
    n_ids, n_rows = 1, 0
    b_id = np.zeros(beam, np.int32)
    b_pb = np.full(beam, NEG_INF)
    b_pnb = np.full(beam, NEG_INF)
    b_pb[0], nb = 0.0, 1
    c_id = np.empty(beam * C, np.int32)
    c_pb = np.empty(beam * C)
    c_pnb = np.empty(beam * C)
    score, inside = np.empty(beam * C), np.empty(beam * C)  # _select's scratch, reused every frame
    act = np.empty(C, np.int32)  # this frame's symbols above log_thresh, in symbol order
    for t in range(T):
        f = lp[t]
        n_act = 0
        for c in range(1, C):
            if f[c] >= log_thresh:
                act[n_act] = c
                n_act += 1
        nc = 0
        for i in range(nb):
            p, pb, pnb = b_id[i], b_pb[i], b_pnb[i]
            tot = log_add(pb, pnb)
            last = label[p]
            if stamp[p] != t:
                stamp[p], pos[p] = t, nc
                c_id[nc], c_pb[nc], c_pnb[nc] = p, NEG_INF, NEG_INF
                nc += 1
            k = pos[p]
            c_pb[k] = log_add(c_pb[k], tot + f[0])
            if last >= 0:
                c_pnb[k] = log_add(c_pnb[k], pnb + f[last])
            nd = node[p]
            for j in range(n_act):
                c = act[j]
                if c == space and (p == 0 or last == space):
                    # ending in space either way; after a space label the repeat is counted above
                    c_pnb[k] = log_add(c_pnb[k], (pb if last == space else tot) + f[c])
                    continue
                tree_next = -1
                if constrained:
                    tree_next = next_node[0 if nd < 0 else nd, c]
                    ends_word = nd >= 0 and node_word[nd] >= 0
                    if tree_next < 0 and not (is_non_word[c] and (nd < 0 or ends_word)):
                        continue  # neither spells on in the dictionary nor may stand between words
                if row[p] < 0:
                    row[p] = n_rows
                    child[n_rows, :] = -1
                    n_rows += 1
                q = child[row[p], c]
                if q < 0:
                    q = n_ids
                    n_ids += 1
                    child[row[p], c] = q
                    parent[q], label[q], row[q], stamp[q], done[q] = p, c, -1, -1, -1
                    node[q], hist[q], lm_base[q], lm_fc[q] = -1, hist[p], lm_base[p], 0.0
                    if constrained:
                        h = hist[p]
                        if tree_next >= 0:  # a word starts or goes on: the forecast follows the node
                            node[q] = tree_next
                            if mode >= MODE_FORECAST:
                                lm_fc[q] = _forecast(tree_next, h, mode, samples, node_lo, node_hi, uni, cum_uni,
                                                     row_start, row_word, row_disc, cum_disc, backoff)
                        elif nd >= 0:  # a non-word label completes the word
                            w = node_word[nd]
                            done[q], hist[q] = w, w
                            if mode >= MODE_NGRAMS:
                                lm_base[q] += math.log(_prob(w, h, uni, row_start, row_word, row_disc, backoff))
                if stamp[q] != t:
                    stamp[q], pos[q] = t, nc
                    c_id[nc], c_pb[nc], c_pnb[nc] = q, NEG_INF, NEG_INF
                    nc += 1
                k = pos[q]
                c_pnb[k] = log_add(c_pnb[k], (pb if c == last else tot) + f[c])
        nb = _select(c_id, c_pb, c_pnb, nc, lm_base, lm_fc, lm_weight, beam, score_gap, b_id, b_pb, b_pnb, score,
                     inside)
    return _best(b_id, b_pb, b_pnb, nb, constrained, mode, lm_weight, parent, label, node, hist, done, lm_base,
                 lm_fc, node_word, uni, row_start, row_word, row_disc, backoff)


@njit(cache=True, nogil=True)
def _select(c_id, c_pb, c_pnb, nc, lm_base, lm_fc, lm_weight, beam, score_gap, b_id, b_pb, b_pnb, score, inside):
    """Copy the ``beam`` best candidates (CTC + weighted LM score) into the beam arrays.

    The cut is the larger of the beam-th best score and the frame's best less ``score_gap``.
    The beam-th best is looked for among the scores within the gap only (``inside``): where
    fewer than ``beam`` are, it lies below the gap and the gap's bound is the cut; otherwise it
    is theirs. ``score`` and ``inside``: scratch of at least ``nc`` (the caller's, reused)."""
    top = NEG_INF
    for k in range(nc):
        q = c_id[k]
        score[k] = log_add(c_pb[k], c_pnb[k]) + lm_weight * (lm_base[q] + lm_fc[q])
        top = max(top, score[k])
    cut = top - score_gap
    n_in = 0
    for k in range(nc):
        if score[k] >= cut:
            inside[n_in] = score[k]
            n_in += 1
    if n_in >= beam:  # the beam-th best of all is the beam-th best of these, at or above the gap's bound
        cut = np.partition(inside[:n_in], n_in - beam)[n_in - beam]
    nb = 0
    for strict in (True, False):  # above the cut first, then ties up to the width
        for k in range(nc):
            if nb < beam and (score[k] > cut if strict else score[k] == cut):
                b_id[nb], b_pb[nb], b_pnb[nb] = c_id[k], c_pb[k], c_pnb[k]
                nb += 1
    return nb


@njit(cache=True, nogil=True)
def _best(b_id, b_pb, b_pnb, nb, constrained, mode, lm_weight, parent, label, node, hist, done, lm_base, lm_fc,
          node_word, uni, row_start, row_word, row_disc, backoff):
    """The best final beam: a partial word must be a dictionary word (it is completed)."""
    best, best_score, fallback, fallback_score, final_word = -1, NEG_INF, b_id[0], NEG_INF, -1
    for i in range(nb):
        p = b_id[i]
        lm = lm_base[p] + lm_fc[p]
        s = log_add(b_pb[i], b_pnb[i])
        if s + lm_weight * lm > fallback_score:
            fallback, fallback_score = p, s + lm_weight * lm
        w = -1
        if constrained and node[p] >= 0:
            w = node_word[node[p]]
            if w < 0:
                continue  # ends inside something that is no dictionary word
            lm = lm_base[p]
            if mode >= MODE_NGRAMS:
                lm += math.log(_prob(w, hist[p], uni, row_start, row_word, row_disc, backoff))
        if s + lm_weight * lm > best_score:
            best, best_score, final_word = p, s + lm_weight * lm, w
    if best < 0:
        best = fallback  # every beam is inside a non-word: keep its completed words only
    n = 0
    q = best
    while q > 0:
        n += 1
        q = parent[q]
    labels = np.empty(n, np.int32)
    words = np.empty(n + 1, np.int32)
    n_words = 0
    q = best
    for j in range(n - 1, -1, -1):
        labels[j] = label[q]
        if done[q] >= 0:
            words[n_words] = done[q]
            n_words += 1
        q = parent[q]
    words[:n_words] = words[:n_words][::-1].copy()
    if final_word >= 0:
        words[n_words] = final_word
        n_words += 1
    return labels, words[:n_words]
