"""The TDT's greedy search (objectives/tdt.py): batched against a one-utterance-at-a-time loop written
from the paper's rule, on a joint whose answers are set per frame (so the path is known), and on a
real tiny model; the same tokens whether or not it stops early; the objective dispatches on durations.
Its beam search (objectives/tdt_search.py): with every hypothesis kept, each final score is the
sequence's log-probability over every alignment, as the loss's reference computes it."""
import pytest
import torch

from speechperf.models import build_model, model_config
from speechperf.objectives import objective_of
from speechperf.objectives.tdt import greedy_tdt
from speechperf.objectives.tdt_reference import log_likelihood
from speechperf.objectives.tdt_search import tdt_beam_hypotheses, tdt_beam_search

V, DURS = 6, (0, 1, 2, 3, 4)


class Table:
    """A joint that ignores the prediction network: its logits are the encoder frame's (B, V + D)."""

    cfg = type("C", (), {"num_classes": V})()

    def predict_step(self, tokens, state):
        return torch.zeros(tokens.shape[0], V + len(DURS)), (torch.zeros(tokens.shape[0], 1),)

    def joint(self, enc, g):
        return enc + g


def frame(token, duration):
    x = torch.zeros(V + len(DURS))
    x[token], x[V + DURS.index(duration)] = 5.0, 5.0
    return x


def one_by_one(model, enc, length, max_symbols=5):
    """The rule, one utterance: argmax token and duration at the pointer; a label is emitted; a blank, or
    the max_symbols-th label at one frame, moves at least one frame."""
    g, state = model.predict_step(torch.zeros(1, dtype=torch.long), None)
    t, here, out = 0, 0, []
    while t < length:
        logits = model.joint(enc[None, t], g)[0]
        k, d = int(logits[:V].argmax()), DURS[int(logits[V:].argmax())]
        if k != 0:
            out.append(k)
            g, state = model.predict_step(torch.tensor([k]), state)
            here += 1
        if k == 0 or here >= max_symbols:
            d = max(d, 1)
        t, here = t + d, (0 if d > 0 else here)
    return out


def test_a_set_path_is_followed():
    # t0: label 3 for 2 frames; t2: blank for 1; t3: label 4 staying (d=0): the cap of 5 moves it on; t4: 2, 3 frames
    frames = [frame(3, 2), frame(1, 0), frame(0, 1), frame(4, 0), frame(2, 3), frame(5, 1), frame(5, 1)]
    enc = torch.stack(frames)[None]  # (1, 7, V + D)
    want = [3, 4, 4, 4, 4, 4, 2]  # t5, t6 are skipped by t4's duration 3
    assert one_by_one(Table(), enc[0], 7) == want
    for stop in (True, False):
        assert greedy_tdt(Table(), enc, torch.tensor([7]), DURS, stop_early=stop) == [want]
    assert greedy_tdt(Table(), enc, torch.tensor([3]), DURS) == [[3]]  # t3 is past its 3 frames


def test_batched_equals_one_at_a_time_on_a_real_model():
    torch.manual_seed(0)
    cfg = model_config({"name": "transducer", "encoder": "conformer", "d_model": 16, "layers": 1, "heads": 2,
                        "conv_kernel": 3, "subsampling_channels": 4, "pred_dim": 16, "joint_dim": 16, "num_classes": V,
                        "durations": "0,1,2,3,4"})
    model = build_model(cfg).eval()
    with torch.no_grad():
        for p in model.out.parameters():
            p.mul_(8.0)  # sharper argmaxes: labels and durations of every kind appear
        enc, lens = model(torch.randn(4, 120, 93), torch.tensor([120, 90, 33, 4]))
        want = [one_by_one(model, enc[b], int(lens[b])) for b in range(4)]
        assert sum(map(len, want)) > 4
        for stop in (True, False):
            assert greedy_tdt(model, enc, lens, DURS, stop_early=stop) == want
        assert objective_of(model).decode_ids(model, enc, lens, "beam", 1) == want  # beam 1: greedy
        beams = objective_of(model).decode_ids(model, enc, lens, "beam", 4)
        assert beams == [tdt_beam_search(model, enc[b, : int(lens[b])], DURS, beam=4) for b in range(4)]


def tiny_tdt(classes: int, durations: str, seed: int = 0):
    torch.manual_seed(seed)
    cfg = model_config({"name": "transducer", "encoder": "lstm", "enc_hidden": 16, "enc_pre_layers": 1,
                        "enc_post_layers": 1, "pred": "lstm", "pred_dim": 16, "joint_dim": 16, "dropout": 0.0,
                        "pred_dropout": 0.0, "num_classes": classes, "durations": durations})
    return build_model(cfg).eval()


def exact_log_prob(model, enc: torch.Tensor, tokens: list[int], durations: tuple[int, ...]) -> float:
    """log P(tokens | enc) over every TDT alignment: the loss's reference on the model's whole lattice."""
    y = torch.tensor([tokens], dtype=torch.long).reshape(1, len(tokens))
    g, _ = model.predict(y)
    logits = model.joint(enc[None, :, None], g[:, None]).float()  # (1, T', U+1, V + D)
    V = model.cfg.num_classes
    lp_tok, lp_dur = logits[..., :V].log_softmax(-1), logits[..., V:].log_softmax(-1)
    ll = log_likelihood(lp_tok, lp_dur, y, torch.tensor([enc.shape[0]]), torch.tensor([len(tokens)]),
                        list(durations), blank=0)
    return float(ll[0])


@pytest.mark.parametrize("durations", [(0, 1, 2), (1, 2), (0, 1, 3)])
def test_a_wide_beam_scores_every_sequence_exactly(durations):
    model = tiny_tdt(3, ",".join(map(str, durations)))
    with torch.no_grad():
        enc, _ = model(torch.randn(1, 18, 93), torch.tensor([18]))  # 3 encoder frames
        hyps = tdt_beam_hypotheses(model, enc[0], durations, beam=100_000, max_symbols=3)
        short = [h for h in hyps if len(h.tokens) <= 3]  # the cap of 3 labels a frame excludes none of their paths
        reachable = 1 + 2 + 4 + 8 if 0 in durations else 1 + 2 + 4  # without d=0: a label a frame, landing < 3
        assert len(short) == reachable
        for h in short:
            assert h.score == pytest.approx(exact_log_prob(model, enc[0], list(h.tokens), durations), abs=1e-4)
        assert [h.score for h in hyps] == sorted((h.score for h in hyps), reverse=True)


def test_the_beam_finds_at_least_greedy_s_sequence():
    for seed in range(3):
        model = tiny_tdt(5, "0,1,2,3", seed=seed)
        with torch.no_grad():
            for p in model.out.parameters():
                p.mul_(4.0)
            enc, lens = model(torch.randn(1, 60, 93), torch.tensor([60]))
            greedy = greedy_tdt(model, enc, lens, (0, 1, 2, 3))[0]
            best = tdt_beam_search(model, enc[0], (0, 1, 2, 3), beam=8)
            got, base = (exact_log_prob(model, enc[0], seq, (0, 1, 2, 3)) for seq in (best, greedy))
            assert got >= base - 1e-4


def test_no_frames_no_hypothesis():
    model = tiny_tdt(3, "0,1")
    assert tdt_beam_hypotheses(model, torch.zeros(0, 16), (0, 1)) == []


@pytest.mark.cuda
def test_the_beam_on_cuda_keeps_the_cpu_s_hypotheses_and_scores():
    """The search is written once for any device: on a GPU the same sequences, in the same order, with the
    same scores within float rounding (the model's GEMMs differ in the last bits)."""
    model = tiny_tdt(5, "0,1,2,3", seed=1)
    with torch.no_grad():
        enc, _ = model(torch.randn(1, 60, 93), torch.tensor([60]))
        want = tdt_beam_hypotheses(model, enc[0], (0, 1, 2, 3), beam=4)
        dev = torch.device("cuda", 0)
        got = tdt_beam_hypotheses(model.to(dev), enc[0].to(dev), (0, 1, 2, 3), beam=4)
    assert [h.tokens for h in got] == [h.tokens for h in want]
    assert [h.score for h in got] == pytest.approx([h.score for h in want], abs=1e-3)
