"""Transducer decoding (speechperf/objectives/transducer_search.py): batched greedy search equals
greedy search of each utterance alone, padding changes nothing, beam 1 is greedy search, merged
beam scores are the sequences' exact probabilities, and a tiny model trained on two utterances
with a small RNN-T loss (written here: log-softmax and the forward recursion) decodes them."""
import math

import pytest
import torch

from speechperf.models import build_model, model_config
from speechperf.objectives.transducer_search import beam_batch, beam_hypotheses, beam_search, beam_tokens, greedy_batch

SIZES = {"pred_dim": 16, "joint_dim": 16, "dropout": 0.0, "attention_dropout": 0.0, "pred_dropout": 0.0}
ENCODERS = {"conformer": {"encoder": "conformer", "d_model": 16, "layers": 1, "heads": 2, "conv_kernel": 3,
                          "subsampling_channels": 4},
            "lstm": {"encoder": "lstm", "enc_hidden": 16, "enc_pre_layers": 1, "enc_post_layers": 1}}
LR = 0.02  # Adam's
KINDS = [("conformer", "lstm"), ("lstm", "stateless")]


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny tensors: a second thread only waits for the first (on a busy 2-core machine a test
    here took 15x longer with two)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def model_of(encoder: str, pred: str, classes: int = 30, seed: int = 0, **kw):
    torch.manual_seed(seed)
    return build_model(model_config({"name": "transducer", **ENCODERS[encoder], "pred": pred,
                                     "num_classes": classes, **SIZES, **kw})).eval()


def log_likelihood(logits: torch.Tensor, targets: torch.Tensor, frames: torch.Tensor,
                   labels: torch.Tensor) -> torch.Tensor:
    """log P(y | x) per utterance, summed over every alignment: logits (B, T, U+1, V), targets (B, U).
    alpha(t, u) = logadd(alpha(t-1, u) + blank(t-1, u), alpha(t, u-1) + y_u(t, u-1)); along u that
    is alpha(t, u) = C(u) + logcumsumexp_k(stay(k) - C(k)), C(u) the emissions' sum below u, so one
    frame is one vectorized step."""
    lp = logits.float().log_softmax(-1)
    b, t_max, u1, _ = lp.shape
    blank = lp[..., 0]  # (B, T, U+1)
    index = targets.clamp(min=0)[:, None, :, None].expand(b, t_max, u1 - 1, 1)
    emit = lp[:, :, :-1].gather(-1, index)[..., 0]  # (B, T, U): the next label's log-prob
    cum = torch.nn.functional.pad(emit.cumsum(-1), (1, 0))  # (B, T, U+1): C(u) per frame
    alpha = cum[:, 0]  # frame 0: only emissions
    alphas = [alpha]
    for t in range(1, t_max):
        stay = alpha + blank[:, t - 1]  # (B, U+1)
        alpha = cum[:, t] + torch.logcumsumexp(stay - cum[:, t], dim=-1)
        alphas.append(alpha)
    alphas = torch.stack(alphas, 1)  # (B, T, U+1)
    rows = torch.arange(b)
    return alphas[rows, frames - 1, labels] + blank[rows, frames - 1, labels]


def sequence_log_prob(model, enc: torch.Tensor, tokens: list[int]) -> float:
    """log P(tokens | enc) of one utterance (enc (T', J)), every alignment summed."""
    y = torch.tensor([tokens], dtype=torch.long).reshape(1, len(tokens))
    g, _ = model.predict(y)
    logits = model.joint(enc[None, :, None], g[:, None])
    return float(log_likelihood(logits, y, torch.tensor([enc.shape[0]]), torch.tensor([len(tokens)]))[0])


def test_the_tests_loss_sums_every_alignment():
    """The recursion against a brute-force sum over the paths of a 3-frame, 2-label lattice."""
    torch.manual_seed(0)
    logits, y = torch.randn(1, 3, 3, 4), torch.tensor([[2, 3]])
    lp = logits.log_softmax(-1)[0]

    def paths(t, u):  # log-probs of the alignments from (t, u) to the end
        if t == 2 and u == 2:
            return [lp[t, u, 0]]
        out = [] if u == 2 else [lp[t, u, y[0, u]] + p for p in paths(t, u + 1)]
        return out + ([] if t == 2 else [lp[t, u, 0] + p for p in paths(t + 1, u)])

    want = torch.logsumexp(torch.stack(paths(0, 0)), 0)
    torch.testing.assert_close(log_likelihood(logits, y, torch.tensor([3]), torch.tensor([2]))[0], want)


@pytest.mark.parametrize("encoder, pred", KINDS)
@pytest.mark.parametrize("classes", [30, 257])
def test_a_batch_decodes_as_each_utterance_alone(encoder, pred, classes):
    """Garbage in the padding, utterances of other lengths beside it: the batch's tokens are
    each utterance's own; with or without the early stop."""
    model = model_of(encoder, pred, classes)
    lens = torch.tensor([47, 80, 12, 1])
    x = torch.full((4, 80, 93), 1e3)
    for b, n in enumerate(lens.tolist()):
        x[b, :n] = torch.randn(n, 93)
    with torch.no_grad():
        enc, out = model(x, lens)
        batch = greedy_batch(model, enc, out, max_symbols=3)
        assert greedy_batch(model, enc, out, max_symbols=3, stop_early=False) == batch
        for b, n in enumerate(lens.tolist()):
            alone, alone_out = model(x[b: b + 1, :n], lens[b: b + 1])
            assert greedy_batch(model, alone, alone_out, max_symbols=3) == [batch[b]]
    assert any(batch) and all(0 < t < classes for hyp in batch for t in hyp)  # an untrained model emits


@pytest.mark.parametrize("encoder, pred", KINDS)
@pytest.mark.parametrize("max_symbols", [1, 3])
def test_beam_one_is_greedy_search(encoder, pred, max_symbols):
    for seed in range(2):
        model = model_of(encoder, pred, seed=seed)
        lens = torch.tensor([40, 27])
        with torch.no_grad():
            enc, out = model(torch.randn(2, 40, 93), lens)
            greedy = greedy_batch(model, enc, out, max_symbols=max_symbols)
            for b in range(2):
                assert beam_search(model, enc[b, : out[b]], beam=1, max_symbols=max_symbols) == greedy[b]
                if max_symbols == 1:
                    assert len(greedy[b]) <= int(out[b])


@pytest.mark.parametrize("encoder, pred", KINDS)
def test_a_batchs_beam_search_is_each_utterances_alone(encoder, pred):
    """The batched ALSD: garbage in the padding, utterances of other lengths beside it (one too
    short for a frame): each utterance's final hypotheses are those it gets alone, scores and all."""
    model = model_of(encoder, pred, classes=40)
    lens = torch.tensor([47, 80, 12, 3, 61])
    x = torch.full((5, 80, 93), 1e3)
    for b, n in enumerate(lens.tolist()):
        x[b, :n] = torch.randn(n, 93)
    with torch.no_grad():
        enc, out = model(x, lens)
        out = out.clone()
        out[3] = 0  # an utterance with no encoder frame: no hypothesis
        batch = beam_batch(model, enc, out, beam=3, max_symbols=2)
        for b, n in enumerate(out.tolist()):
            alone = beam_hypotheses(model, enc[b, :n], beam=3, max_symbols=2) if n else []
            assert [(h.tokens, h.frame) for h in batch[b]] == [(h.tokens, h.frame) for h in alone]
            assert [h.score for h in batch[b]] == pytest.approx([h.score for h in alone], abs=1e-5)
        assert beam_tokens(model, enc, out, beam=3, max_symbols=2) == [list(h[0].tokens) if h else [] for h in batch]
    assert batch[3] == [] and all(batch[b] for b in (0, 1, 2, 4))


def test_at_most_max_symbols_per_frame():
    """A joint that always prefers a symbol: greedy and beam search emit max_symbols per frame."""
    model = model_of("lstm", "lstm")
    with torch.no_grad():
        model.out.bias[1:] += 50.0
        enc, out = model(torch.randn(1, 30, 93), torch.tensor([30]))
        for m in (1, 2, 4):
            assert len(greedy_batch(model, enc, out, max_symbols=m)[0]) == m * int(out[0])
            assert len(beam_search(model, enc[0], beam=3, max_symbols=m)) == m * int(out[0])


def test_merged_scores_are_the_exact_sequence_probabilities():
    """A beam wide enough to keep every hypothesis merges every alignment of a sequence: each
    final score is log P(y | x) summed over the alignments (symbols per frame capped at 3, so
    exact for sequences of up to 3 units); the best one is the most probable sequence."""
    model = model_of("lstm", "lstm", classes=3)
    with torch.no_grad():
        enc, out = model(torch.randn(1, 18, 93), torch.tensor([18]))  # 3 encoder frames
        hyps = beam_hypotheses(model, enc[0], beam=10_000, max_symbols=3)
        short = [h for h in hyps if len(h.tokens) <= 3]
        assert len(short) == 1 + 2 + 4 + 8  # every sequence over 2 units of length <= 3
        for h in short:
            assert h.score == pytest.approx(sequence_log_prob(model, enc[0], list(h.tokens)), abs=1e-4)
        assert [h.score for h in hyps] == sorted((h.score for h in hyps), reverse=True)


@pytest.mark.parametrize("encoder, pred", KINDS)
def test_the_beams_best_is_at_least_greedys(encoder, pred):
    for seed in range(2):
        model = model_of(encoder, pred, seed=seed)
        with torch.no_grad():
            enc, out = model(torch.randn(1, 40, 93), torch.tensor([40]))
            greedy = beam_hypotheses(model, enc[0], beam=1)[0]  # greedy's path and its log-prob
            best = beam_hypotheses(model, enc[0], beam=4)[0]
            assert best.score >= greedy.score
            assert sequence_log_prob(model, enc[0], list(best.tokens)) >= greedy.score  # a path is no more than all


def _train(model, x, lens, targets, labels, steps: int) -> float:
    """``steps`` Adam steps on the batch; the last loss."""
    model.train()
    for _ in range(steps):
        enc, out = model(x, lens)
        g, _ = model.predict(targets)
        loss = -log_likelihood(model.joint(enc[:, :, None], g[:, None]), targets, out, labels).mean()
        model.opt.zero_grad()
        loss.backward()
        model.opt.step()
    model.eval()
    return float(loss.detach())


@pytest.mark.parametrize("encoder, pred", KINDS)
def test_a_tiny_model_learns_two_utterances_and_decodes_them(encoder, pred):
    """Adam on two short utterances (random features, labels of 6 and 4 characters, padded with
    -1) until greedy search gives back the labels (about 100 steps; at most 300): then beam
    search does too, and the labels are nearly certain."""
    model = model_of(encoder, pred)
    model.opt = torch.optim.Adam(model.parameters(), lr=LR)
    torch.manual_seed(1)
    lens, labels = torch.tensor([48, 36]), torch.tensor([6, 4])
    x = torch.randn(2, 48, 93)
    targets = torch.tensor([[8, 5, 12, 12, 15, 1], [23, 15, 18, 4, -1, -1]])
    want = [[8, 5, 12, 12, 15, 1], [23, 15, 18, 4]]
    losses, decoded = [], []
    while len(losses) < 12 and decoded != want:
        losses.append(_train(model, x, lens, targets, labels, steps=25))
        with torch.no_grad():
            enc, out = model(x, lens)
            decoded = greedy_batch(model, enc, out)
    assert decoded == want, (losses, decoded)
    with torch.no_grad():
        assert [beam_search(model, enc[b, : out[b]], beam=4) for b in range(2)] == want
    assert losses[0] > 1.0 and losses[-1] < 0.5  # it learned: P(labels) from under 1/e to over 0.6


@pytest.mark.cuda
def test_greedy_on_cuda_reads_the_device_once():
    """stop_early off (the default on a GPU): one host read per batch, the tokens at the end."""
    import warnings

    from tests.cuda_syncs import sync_warnings

    dev = torch.device("cuda", 0)
    model = model_of("conformer", "lstm").to(dev)
    lens = torch.tensor([60, 37])
    with torch.no_grad():
        enc, out = model(torch.randn(2, 60, 93, device=dev), lens.to(dev))
        want = greedy_batch(model.cpu(), enc.cpu(), out.cpu())
        model.to(dev)
        torch.cuda.synchronize()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                got = greedy_batch(model, enc, model.output_lengths(lens))
            finally:
                torch.cuda.set_sync_debug_mode(0)
    assert len(sync_warnings(caught)) <= 2  # the tokens and their counts, copied at the end
    assert got == want
