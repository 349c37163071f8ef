"""The attention encoder-decoder's objective (objectives/aed.py): teacher forcing's symbols, the
label-smoothed loss against a per-utterance reference, impossible utterances, greedy and beam
decoding against independent searches, and a tiny model that learns its labels."""
import dataclasses
import itertools
import math

import pytest
import torch

from speechperf.corpus import alphabet
from speechperf.models import build_model
from speechperf.models.encdec import AEDConfig
from speechperf.objectives import objective_of
from speechperf.objectives.aed import IGNORE, beam_search, greedy_batch, teacher_forcing

CPU = torch.device("cpu")
TINY = AEDConfig(d_model=32, layers=1, heads=2, subsampling_channels=8, dec_layers=2, dec_heads=2, num_classes=6,
                 dropout=0.0, attention_dropout=0.0, dec_dropout=0.0)


@pytest.fixture(autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def tiny(**kw):
    torch.manual_seed(0)
    return build_model(dataclasses.replace(TINY, **kw)).eval()


def test_teacher_forcing_reads_bos_and_scores_eos():
    inputs, targets = teacher_forcing(torch.tensor([3, 4, 5, 2]), torch.tensor([3, 1]), CPU)
    assert inputs.tolist() == [[0, 3, 4, 5], [0, 2, 0, 0]]
    assert targets.tolist() == [[3, 4, 5, 0], [2, 0, IGNORE, IGNORE]]


def reference_loss(model, enc, b: int, frames: int, labels: list[int], smoothing: float) -> float:
    """One utterance alone: (1 - s) x NLL + s x the mean over the vocabulary of -log p, summed over
    the labels and EOS."""
    logits = model.decode(torch.tensor([[0, *labels]]), enc[b: b + 1, :frames], torch.ones(1, frames, dtype=torch.bool))
    logp = logits[0].log_softmax(-1)  # (U+1, V)
    gold = torch.tensor([*labels, 0])
    nll = -logp[torch.arange(len(gold)), gold]
    return float(((1 - smoothing) * nll - smoothing * logp.mean(-1)).sum())


def test_the_loss_is_each_utterances_label_smoothed_cross_entropy():
    model = tiny()
    obj = objective_of(model)
    with torch.no_grad():
        enc, out_lens = model(torch.randn(2, 90, 93), torch.tensor([90, 41]))
        labels, label_lens = torch.tensor([1, 2, 3, 4, 5, 3]), torch.tensor([4, 2])
        for s in (0.0, 0.1):
            got = obj.losses(model, enc, out_lens, labels, label_lens, CPU, "fp32", smoothing=s)
            want = [reference_loss(model, enc, 0, 12, [1, 2, 3, 4], s), reference_loss(model, enc, 1, 6, [5, 3], s)]
            assert got.tolist() == pytest.approx(want, rel=1e-5)


def test_an_utterance_without_frames_is_impossible_and_left_out():
    model = tiny().train()
    obj = objective_of(model)
    enc, _ = model(torch.randn(2, 40, 93), torch.tensor([40, 40]))
    out_lens = torch.tensor([5, 0])
    batch = type("B", (), {"labels": torch.tensor([1, 2, 3]), "label_lens": torch.tensor([2, 1])})
    tc = type("T", (), {"system": type("S", (), {"precision": "fp32"})})
    with torch.no_grad():
        assert math.isinf(float(obj.eval_losses(model, enc, out_lens, batch.labels, batch.label_lens, CPU, "fp32")[1]))
    loss, impossible = obj.train_loss(model, enc, out_lens, batch, CPU, tc)
    loss.backward()
    assert impossible == 1 and math.isfinite(float(loss.detach()))
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


def test_greedy_is_the_batch_of_each_utterances_argmax_path():
    model = tiny(decode_ratio=0.5)
    with torch.no_grad():
        model.out.bias[0] = -6.0  # EOS (tied: its own embedding read back) less likely: paths of several tokens
        enc, out_lens = model(torch.randn(3, 90, 93), torch.tensor([90, 60, 33]))
        got = greedy_batch(model, enc, out_lens)
        for b, n in enumerate(out_lens.tolist()):
            path = [0]
            while len(path) <= math.ceil(0.5 * n) + 1:  # the tokens after BOS: at most max_tokens
                nxt = int(model.decode(torch.tensor([path]), enc[b: b + 1, :n], torch.ones(1, n, dtype=torch.bool))
                          [0, -1].argmax())
                if nxt == 0:
                    break
                path.append(nxt)
            assert got[b] == path[1:]
        assert any(len(g) > 1 for g in got)
        assert [beam_search(model, enc[b: b + 1, :n], beam=1) for b, n in enumerate(out_lens.tolist())] == got


def test_a_wide_beam_finds_the_best_length_normalised_sequence():
    """Exhaustive: a beam wider than every hypothesis equals enumerating every sequence (ending in
    EOS, or unfinished at the limit) and taking the best log-probability / length ** penalty."""
    for penalty in (0.0, 1.0):
        model = tiny(decode_ratio=0.2, length_penalty=penalty)  # 8 frames: at most ceil(1.6) + 1 = 3 tokens
        with torch.no_grad():
            model.out.bias[0] = -1.0
            enc, _ = model(torch.randn(1, 60, 93), torch.tensor([60]))
            limit, best = 3, (-math.inf, None)
            for k in range(limit + 1):
                for seq in itertools.product(range(1, 6), repeat=k):
                    ended = k < limit
                    path = [0, *seq]
                    valid = torch.ones(1, 8, dtype=torch.bool)
                    logp = model.decode(torch.tensor([path]), enc, valid)[0].log_softmax(-1)
                    score = sum(float(logp[i, t]) for i, t in enumerate(seq)) + (float(logp[k, 0]) if ended else 0.0)
                    best = max(best, (score / (k + ended) ** penalty, list(seq)))
            assert beam_search(model, enc, beam=200) == best[1], penalty


def test_a_tiny_model_learns_its_labels_and_decodes_them():
    model = tiny().train()
    obj = objective_of(model)
    x, lens = torch.randn(2, 64, 93), torch.tensor([64, 48])
    labels, label_lens = torch.tensor([1, 2, 3, 4, 5, 4, 3]), torch.tensor([4, 3])
    batch = type("B", (), {"labels": labels, "label_lens": label_lens})
    tc = type("T", (), {"system": type("S", (), {"precision": "fp32"})})
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    for _ in range(200):
        opt.zero_grad()
        enc, out_lens = model(x, lens)
        obj.train_loss(model, enc, out_lens, batch, CPU, tc)[0].backward()
        opt.step()
    model.eval()
    with torch.no_grad():
        enc, out_lens = model(x, lens)
        assert obj.decode_ids(model, enc, out_lens) == [[1, 2, 3, 4], [5, 4, 3]]
        assert obj.decode_ids(model, enc, out_lens, "beam", 4) == [[1, 2, 3, 4], [5, 4, 3]]
        assert obj.texts(model, enc, out_lens, 1) == [alphabet.decode([1, 2, 3, 4])]  # no units given: characters


def test_a_run_whose_largest_decoder_output_would_not_fit_is_refused(monkeypatch):
    from types import SimpleNamespace

    from speechperf.config import load_preset
    from speechperf.data.batching import Batching
    from speechperf.data.index import from_columns, librispeech_like
    from speechperf.errors import ConfigError

    cfg = load_preset("canary-aed-sizes", ["loader.max_duration=100", "train.system.precision=fp32"])
    full = librispeech_like(0, splits=(256,))
    index = from_columns(full.keys, full.shas, full.shard, full.offset, full.frames, full.duration,
                         [full.id(i) for i in range(len(full))], ["ab ccd"] * len(full))
    batching = Batching(cfg.loader, 0)
    with torch.device("meta"):
        model = build_model(cfg.model)
    obj = objective_of(model)
    need, b = obj.step_bytes(model, cfg, batching, index, None)
    widest = max(len(u) for u in batching.plan(index, epoch=1).batches)
    # characters: 6 and one for the doubled "cc"; U + 1 positions x 1,025 classes x (logits + 3 fp32 tensors)
    assert need == widest * (7 + 1) * 1025 * (4 + 12) and len(batching.plan(index, epoch=1).batches[b]) == widest
    monkeypatch.setattr("speechperf.objectives.aed.psutil.virtual_memory", lambda: SimpleNamespace(available=need))
    obj.check_memory(model, cfg, batching, index, None, CPU)  # fits exactly
    monkeypatch.setattr("speechperf.objectives.aed.psutil.virtual_memory", lambda: SimpleNamespace(available=need - 1))
    with pytest.raises(ConfigError, match=f"the decoder's outputs of batch {b} need"):
        obj.check_memory(model, cfg, batching, index, None, CPU)
