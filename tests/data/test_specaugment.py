import pytest
import torch

from speechperf.data import specaugment
from speechperf.data.specaugment import SpecAugmentConfig, apply, masks

ALGOPERF = SpecAugmentConfig(freq_masks=2, freq_width=27, time_masks=10, time_width=40, time_ratio=0.05)


def reference_masks(lengths, frames, columns, cfg):
    """Loop form of the masks from the same draws (widths, then starts; frequency, then time)."""
    b = len(lengths)
    time_keep, freq_keep = torch.ones(b, frames), torch.ones(b, columns)
    if cfg.freq_masks:
        u_w, u_s = torch.rand(b, cfg.freq_masks, dtype=torch.float64), torch.rand(b, cfg.freq_masks, dtype=torch.float64)
        for i in range(b):
            for m in range(cfg.freq_masks):
                w = min(int(u_w[i, m] * (cfg.freq_width + 1)), cfg.freq_width)
                s = int(u_s[i, m] * (cfg.dims - w + 1))
                freq_keep[i, s: s + w] = 0
    if cfg.time_masks:
        u_w, u_s = torch.rand(b, cfg.time_masks, dtype=torch.float64), torch.rand(b, cfg.time_masks, dtype=torch.float64)
        for i, n in enumerate(lengths):
            top = min(cfg.time_width, int(n * cfg.time_ratio))
            for m in range(cfg.time_masks):
                w = min(int(u_w[i, m] * (top + 1)), top)
                s = int(u_s[i, m] * (n - w + 1))
                time_keep[i, s: s + w] = 0
    return time_keep, freq_keep


def test_masks_equal_the_loop_reference_exactly():
    lengths = [1000, 400, 37, 820]
    torch.manual_seed(5)
    got = masks(torch.tensor(lengths), 1000, 93, ALGOPERF)
    torch.manual_seed(5)
    ref = reference_masks(lengths, 1000, 93, ALGOPERF)
    assert torch.equal(got[0], ref[0]) and torch.equal(got[1], ref[1])
    assert got[0].min() == 0 and got[1].min() == 0  # something was masked


def test_a_seeded_batch_masks_these_exact_spans():
    """Pins the spans of one seed: a change in the draws (order, count, rounding) shows."""
    torch.manual_seed(0)
    cfg = SpecAugmentConfig(freq_masks=1, freq_width=10, time_masks=1, time_width=40, time_ratio=0.05)
    time_keep, freq_keep = masks(torch.tensor([200, 400]), 400, 93, cfg)

    def spans(row):
        zero = (row == 0).nonzero().flatten().tolist()
        return (zero[0], len(zero)) if zero else None

    # seed 0's doubles: widths .970 .708, starts .459 .921 (frequency), then .645 .791, .179 .351 (time)
    # frequency: width floor(.970 * 11) = 10, start floor(.459 * (80 - 10 + 1)) = 32; 7 at floor(.921 * 74) = 68
    assert [spans(r) for r in freq_keep] == [(32, 10), (68, 7)]
    # time: at most min(40, 5% of 200) = 10: floor(.645 * 11) = 7 at floor(.179 * 194) = 34;
    # at most min(40, 5% of 400) = 20: floor(.791 * 21) = 16 at floor(.351 * 385) = 135
    assert [spans(r) for r in time_keep] == [(34, 7), (135, 16)]


@pytest.mark.parametrize("seed", range(20))
def test_widths_within_bounds_and_valid_frames_only(seed):
    torch.manual_seed(seed)
    lengths = torch.tensor([1670, 600, 120, 20, 1])
    cfg = ALGOPERF
    x = torch.randn(5, 1700, 93)
    y = apply(x, lengths, cfg)
    for b, n in enumerate(lengths.tolist()):
        assert torch.equal(y[b, n:], x[b, n:]), "a mask reached the padding"
        frames, columns = (y[b, :n] == 0).all(dim=1), (y[b, :n] == 0).all(dim=0)  # fully masked
        assert frames.sum() <= cfg.time_masks * min(cfg.time_width, int(n * cfg.time_ratio))
        assert not columns[cfg.dims:].any(), "an MFCC column was masked"
        assert columns.sum() <= cfg.freq_masks * cfg.freq_width
        assert torch.equal(y[b, :n] == 0, frames[:, None] | columns[None, :]), "a partly masked value"
    assert not (y[4, :1] == 0).all(dim=1).any()  # 1 frame: 5% of it rounds down to a width of 0


def test_off_by_default_draws_nothing_and_returns_the_batch():
    x = torch.randn(2, 50, 93)
    state = torch.get_rng_state()
    assert apply(x, torch.tensor([50, 30]), SpecAugmentConfig()) is x
    assert torch.equal(torch.get_rng_state(), state)  # a DS2 run's dropout masks are unchanged


def test_resume_draws_the_same_masks_from_the_saved_rng_state():
    x, lens = torch.randn(3, 300, 93), torch.tensor([300, 200, 90])
    state = torch.get_rng_state()
    first = apply(x, lens, ALGOPERF)
    torch.set_rng_state(state)  # what a resumed run restores from its checkpoint
    assert torch.equal(apply(x, lens, ALGOPERF), first)
    assert not torch.equal(apply(x, lens, ALGOPERF), first)


def test_input_untouched_and_dtype_kept():
    x = torch.randn(2, 300, 93, dtype=torch.bfloat16)
    before = x.clone()
    y = apply(x, torch.tensor([300, 120]), ALGOPERF)
    assert torch.equal(x, before) and y.dtype == torch.bfloat16 and y.shape == x.shape
    assert ((y == 0) | (y == x)).all()  # masking only zeroes values


def test_masks_are_built_on_the_cpu_from_cpu_lengths(monkeypatch):
    """apply() reads only the CPU lengths: the feature values never go to the host."""
    seen = []
    real = specaugment.masks
    monkeypatch.setattr(specaugment, "masks", lambda lengths, *a: seen.append(lengths.device) or real(lengths, *a))
    apply(torch.randn(2, 100, 93), torch.tensor([100, 50]), ALGOPERF)
    assert seen == [torch.device("cpu")]


def test_no_batch_sized_mask_crosses_to_the_device(monkeypatch):
    """Only the (B, T) and (B, F) masks go from the host to the batch's device (the meta device
    here stands in for a GPU): a host-built (B, T, F) mask would cross whole every step."""
    crossed = []
    real = torch.Tensor.to

    def to(self, *args, **kwargs):
        out = real(self, *args, **kwargs)
        if self.device.type == "cpu" and out.device.type != "cpu":
            crossed.append(tuple(self.shape))
        return out

    monkeypatch.setattr(torch.Tensor, "to", to)
    y = apply(torch.empty(4, 300, 93, device="meta"), torch.tensor([300, 200, 90, 10]), ALGOPERF)
    assert y.device.type == "meta" and y.shape == (4, 300, 93)
    assert sorted(crossed) == [(4, 93), (4, 300), (4, 300)]


@pytest.mark.parametrize("kw,match", [
    ({"freq_masks": -1}, r"augment\.freq_masks=-1 must be >= 0"),
    ({"time_ratio": 1.5}, r"augment\.time_ratio=1\.5 must be in \[0, 1\]"),
    ({"freq_masks": 2, "freq_width": 81}, r"augment\.freq_width=81 must be <= augment\.dims=80"),
    ({"dims": 0}, r"augment\.dims=0 must be >= 1"),
])
def test_problems_name_the_field(kw, match):
    import re

    problems = SpecAugmentConfig(**kw).problems()
    assert len(problems) == 1 and re.search(match, problems[0]), problems
    assert ALGOPERF.problems() == [] and SpecAugmentConfig().problems() == []


def test_the_augment_section_of_a_preset():
    from speechperf.config import ConfigError, RunConfig, load_preset

    assert load_preset("cpu").augment == SpecAugmentConfig()  # DS2's presets: off
    cfg = load_preset("conformer")
    assert cfg.augment == ALGOPERF and RunConfig.from_dict(cfg.to_dict()) == cfg
    assert RunConfig.from_dict({k: v for k, v in cfg.to_dict().items() if k != "augment"}).augment == SpecAugmentConfig()
    assert load_preset("conformer", ["augment.time_masks=3"]).augment.time_masks == 3
    with pytest.raises(ConfigError, match=r"augment\.time_ratio=2\.0 must be in \[0, 1\]"):
        load_preset("conformer", ["augment.time_ratio=2"])
