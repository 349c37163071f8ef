"""An epoch's batches, planned up front from the compact index as a pure function of (seed, epoch).

Planning keeps shard locality: the shards are shuffled and taken ``bucket_window`` at a time;
within such a window the utterances are sorted by length (``bucket`` mode) or kept in
shuffled order (``pad`` mode, the paper's) and cut into batches, and the window's batches are
shuffled. A reader that owns a window's batches reads each of its shards once (loader.py).

Three ways to cut a window (``batch_size`` is the global batch, ``max_duration`` per rank):
- ``full``: full batches of ``batch_size`` and the window's remainder (512 utterances in
  batches of 240: 240, 240, 32). The tiny preset's reference convergence points
  were measured with exactly these batches; it stays the default.
- ``balanced`` (``loader.balance = true``): the fewest batches of at most ``batch_size``,
  of near-equal sizes (512 in batches of 240: 171, 171, 170): no batch under half the size but
  a window's last one when the window itself is smaller.
- ``duration`` (``loader.max_duration`` > 0): batches of at most ``max_duration`` padded
  seconds (utterances x the longest one's cost, the longest padded to ``pad_frames`` in pad
  mode; cost d + d^2 / quadratic_duration with lhotse's quadratic penalty), the fewest per
  window; the last two share their utterances evenly (no small remainder batch).

Ranks: with fixed counts every batch is split across the ranks (rank r takes utterances r,
r + world, ...; a batch smaller than ``world`` is dropped), so all ranks step together. With
``max_duration`` each batch is one rank's: the epoch is planned globally, the last (count mod
world) batches of the planned order are dropped, and batch i goes to rank i mod world, so
every rank runs the same number of steps and sees each window's batches consecutively.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from speechperf.data.loader_config import LoaderConfig
from speechperf.data.index import Index
from speechperf.errors import SpeechperfError

FRAME_S = 0.01  # seconds per feature frame (the features' 10 ms hop): pad_frames in seconds


@dataclass(frozen=True)
class Plan:
    """This rank's batches of one epoch, in the order the training loop sees them."""

    batches: list[np.ndarray]  # utterance numbers (into the Index) of each batch
    groups: np.ndarray  # (len(batches),) int: the window each batch was cut from (readers own windows)

    def __len__(self) -> int:
        return len(self.batches)

    def sliced(self, start: int) -> "Plan":
        return Plan(self.batches[start:], self.groups[start:])


def method(cfg: LoaderConfig) -> str:
    """``full``, ``balanced`` or ``duration``: how this configuration cuts a window."""
    if cfg.max_duration > 0:
        return "duration"
    return "balanced" if cfg.balance else "full"


def plan_epoch(index: Index, cfg: LoaderConfig, epoch: int, seed: int, rank: int = 0, world: int = 1) -> Plan:
    """This rank's batches of ``epoch``, deterministic for (seed, epoch)."""
    if world < 1 or not 0 <= rank < world:
        raise SpeechperfError(f"rank {rank} of world {world} is invalid")
    rng = np.random.default_rng([seed, epoch])
    shards = _shard_order(index, cfg, rng)
    if cfg.sort_first_epoch and epoch == 1:  # SortaGrad: the whole epoch in ascending length
        order = np.lexsort((index.id_rank, index.frames))
        batches = _cut(order, index, cfg)
        groups = np.arange(len(batches))  # one sorted stream: no window a reader could own
    else:
        batches, groups = [], []
        for w, start in enumerate(range(0, len(shards), cfg.bucket_window)):
            window = np.concatenate(shards[start: start + cfg.bucket_window])
            if cfg.mode == "bucket" or not cfg.shuffle:
                window = window[np.lexsort((index.id_rank[window], index.frames[window]))]
            else:
                window = window[rng.permutation(len(window))]
            cut = _cut(window, index, cfg)
            if cfg.shuffle:
                cut = [cut[i] for i in rng.permutation(len(cut))]
            batches += cut
            groups += [w] * len(cut)
        groups = np.array(groups, dtype=np.int64)
    return _for_rank(batches, groups, cfg, rank, world)


def _shard_order(index: Index, cfg: LoaderConfig, rng: np.random.Generator) -> list[np.ndarray]:
    """Each shard's utterance numbers (index order), the shards sorted by key then shuffled."""
    order = np.argsort(index.shard, kind="stable")
    counts = np.bincount(index.shard, minlength=len(index.keys))
    starts = np.concatenate([[0], np.cumsum(counts)])
    present = sorted((s for s in range(len(index.keys)) if counts[s]), key=lambda s: index.keys[s])
    if cfg.shuffle:
        present = [present[i] for i in rng.permutation(len(present))]
    return [order[starts[s]: starts[s + 1]] for s in present]


def _cut(items: np.ndarray, index: Index, cfg: LoaderConfig) -> list[np.ndarray]:
    kind = method(cfg)
    if kind == "full":
        return [items[i: i + cfg.batch_size] for i in range(0, len(items), cfg.batch_size)]
    if kind == "balanced":
        return np.array_split(items, -(-len(items) // cfg.batch_size))
    widths = width_costs(index.duration[items], cfg)
    bounds = _greedy(widths, cfg.max_duration, items, index)
    if len(bounds) > 2:  # every batch full but the last: share the last two batches evenly
        bounds = _even_tail(bounds, widths, cfg.max_duration)
    return [items[a:b] for a, b in zip(bounds[:-1], bounds[1:])]


def _split2(w: np.ndarray) -> tuple[int, float]:
    """Where to cut ``w`` in two so that the larger batch cost is smallest: (cut, that cost)."""
    left = np.arange(1, len(w)) * np.maximum.accumulate(w)[:-1]  # (m - 1,) cost of w[:j], j = 1..m-1
    right = np.arange(len(w) - 1, 0, -1) * np.maximum.accumulate(w[::-1])[::-1][1:]  # cost of w[j:]
    worst = np.maximum(left, right)
    j = int(np.argmin(worst))
    return j + 1, float(worst[j])


def _smallest(w: np.ndarray, cuts: list[int]) -> float:
    edges = [0, *cuts, len(w)]
    return min((b - a) * float(w[a:b].max()) for a, b in zip(edges[:-1], edges[1:]))


def _even_tail(bounds: list[int], widths: np.ndarray, cap: float) -> list[int]:
    """The greedy cut fills every batch but the last: cut the last two batches' utterances
    again where the larger of the two costs is smallest (neither then exceeds the budget); where
    that still leaves one under half the budget (a tail of long utterances), the last three."""
    a, b = bounds[-3], bounds[-1]
    j, _ = _split2(widths[a:b])
    if len(bounds) < 4 or _smallest(widths[a:b], [j]) >= cap / 2:
        return bounds[:-2] + [a + j, b]
    a = bounds[-4]
    w = widths[a:b]
    lo, hi, three = w.sum() / 3, cap, bounds[-4:]  # the smallest budget that still cuts them in three
    for _ in range(20):
        mid = (lo + hi) / 2
        trial = _greedy(w, mid, None, None) if mid >= w.max() else None
        if trial is None or len(trial) > 4:
            lo = mid
        else:
            hi, three = mid, [a + t for t in trial]
    j, _ = _split2(widths[three[-3]: b])  # and the last two of those evenly again
    return bounds[:-3] + three[1:-2] + [three[-3] + j, b] if len(three) == 4 else bounds[:-3] + three[1:]


def batch_frames(frames, cfg: LoaderConfig) -> int:
    """The frames a batch of utterances of ``frames`` is padded to: its longest utterance's,
    rounded up to a multiple of ``pad_multiple`` (pad mode: at least pad_frames), as the loader
    builds it."""
    longest = int(max(frames))
    if cfg.mode == "pad":
        return max(longest, cfg.pad_frames)
    return -(-longest // cfg.pad_multiple) * cfg.pad_multiple


def width_costs(seconds: np.ndarray, cfg: LoaderConfig) -> np.ndarray:
    """What one utterance of ``seconds`` costs a batch as its longest member: its padded width
    (pad mode: at least pad_frames) with lhotse's quadratic penalty d + d^2 / q."""
    d = np.maximum(seconds, cfg.pad_frames * FRAME_S) if cfg.mode == "pad" else np.asarray(seconds, np.float64)
    if cfg.mode != "pad" and cfg.pad_multiple > 1:  # the width the loader pads to (batch_frames)
        step = cfg.pad_multiple * FRAME_S
        d = np.ceil(np.round(d / step, 9)) * step
    return d + d * d / cfg.quadratic_duration if cfg.quadratic_duration > 0 else d


def _greedy(widths: np.ndarray, cap: float, items: np.ndarray | None, index: Index | None) -> list[int] | None:
    """Boundaries of the greedy cut of ``widths`` (in batch order) into batches whose cost
    (size x the largest width) stays within ``cap``: the fewest such batches (``index`` None:
    None where an utterance alone exceeds ``cap``, else that is refused naming it)."""
    bounds, a, n = [0], 0, len(widths)
    while a < n:
        cost = np.arange(1, n - a + 1) * np.maximum.accumulate(widths[a:])  # (n - a,) cost of items a..b
        b = a + int(np.searchsorted(cost, cap, side="right"))
        if b == a and index is None:
            return None
        if b == a:  # exact values, so that the cost is visibly above the cap
            raise SpeechperfError(f"utterance {index.id(int(items[a]))} ({_exact(index.duration[items[a]])} s) costs "
                                  f"{_exact(widths[a])} s, more than loader.max_duration={_exact(cap)}: raise "
                                  "max_duration")
        bounds.append(b)
        a = b
    return bounds


def _exact(x) -> str:
    """The shortest digits that give ``x`` back in its own precision (float32 1.01 is "1.01")."""
    return np.format_float_positional(x, trim="-")


def _for_rank(batches: list[np.ndarray], groups: np.ndarray, cfg: LoaderConfig, rank: int, world: int) -> Plan:
    if world == 1:
        return Plan(batches, groups)
    if method(cfg) == "duration":  # whole batches dealt round robin; the tail that does not divide dropped
        keep = len(batches) - len(batches) % world
        if keep == 0:
            raise SpeechperfError(f"loader.max_duration={cfg.max_duration:g} makes {len(batches)} batches, "
                                  f"fewer than the {world} ranks: lower it")
        return Plan(batches[rank:keep:world], groups[rank:keep:world])
    kept = [i for i, b in enumerate(batches) if len(b) >= world]
    return Plan([batches[i][rank::world] for i in kept], groups[kept] if len(kept) else groups[:0])


def batch_cost(index: Index, batch: np.ndarray, cfg: LoaderConfig) -> float:
    """A duration batch's cost: utterances x the cost of its widest (what max_duration bounds)."""
    return float(len(batch) * width_costs(index.duration[batch], cfg).max())


def steps_per_epoch(index: Index, cfg: LoaderConfig, seed: int, world: int = 1, utterances: int | None = None) -> int:
    """Optimizer steps of one epoch, the unit of the learning-rate schedule's length. The
    ``full`` cut counts ceil(utterances / batch_size), the global batch (its schedules and
    reference convergence points were measured so; ``utterances``: the training splits',
    default the index's); the other cuts count a shuffled epoch's planned batches (epoch 2's
    plan; duration plans vary a little from epoch to epoch)."""
    if method(cfg) == "full":
        return -(-(len(index) if utterances is None else utterances) // cfg.batch_size)
    return len(plan_epoch(index, cfg, 2, seed, 0, world))


def global_batch(index: Index, cfg: LoaderConfig, seed: int, world: int = 1) -> float:
    """Utterances one step of all ``world`` ranks takes: ``batch_size`` for fixed counts (the
    configured batch, as MLPerf logs it), and for ``max_duration`` the mean over a shuffled
    epoch's plan (epoch 2's, as ``steps_per_epoch``): the utterances of every rank's batches
    / the steps. Duration batches have no configured count; this is what a step averaged."""
    if method(cfg) != "duration":
        return float(cfg.batch_size)
    batches = plan_epoch(index, cfg, 2, seed).batches  # the global plan the ranks are dealt from (_for_rank)
    steps = len(batches) // world  # the tail that does not divide is dropped
    return sum(len(b) for b in batches[: steps * world]) / max(steps, 1)
