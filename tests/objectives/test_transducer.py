"""The transducer objective's training loss: the RNN-T loss alone, or with the model's auxiliary CTC
head (``model.ctc_weight``) interpolated in, each term checked against an independent computation
(the reference RNN-T loss in plain torch, torch's ``F.ctc_loss`` on the head's own output)."""
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from speechperf.models import build_model, model_config
from speechperf.objectives import objective_of
from speechperf.objectives.rnnt_reference import rnnt_loss_reference

CPU = torch.device("cpu")
TC = SimpleNamespace(system=SimpleNamespace(precision="fp32", deterministic=False, ctc_kernel="numba"))  # a TrainConfig's [train.system]
SIZES = {"name": "transducer", "encoder": "conformer", "d_model": 16, "layers": 1, "heads": 2, "conv_kernel": 5,
         "subsampling_channels": 4, "pred_dim": 8, "joint_dim": 10, "num_classes": 7, "dropout": 0.0,
         "attention_dropout": 0.0, "pred_dropout": 0.0}


def _model(**kw):
    torch.manual_seed(0)
    return build_model(model_config({**SIZES, **kw})).eval()


def _batch():
    """Two utterances of 24 and 12 input frames (6 and 3 at 4x): labels of 2 and 4, so the second
    has fewer frames than its labels (CTC impossible, RNN-T possible)."""
    feats, lens = torch.randn(2, 24, 93), torch.tensor([24, 12])
    labels, label_lens = torch.tensor([3, 1, 2, 4, 5, 6]), torch.tensor([2, 4])
    return feats, lens, SimpleNamespace(labels=labels, label_lens=label_lens, ctc_frames=None)


def _rnnt_reference(model, out, out_lens, batch) -> torch.Tensor:
    targets = torch.tensor([[3, 1, 0, 0], [2, 4, 5, 6]])
    g, _ = model.predict(targets)
    logits = model.joint(out[:, :, None], g[:, None])
    return rnnt_loss_reference(logits.double(), targets, out_lens, batch.label_lens).float()


def test_without_ctc_weight_the_loss_is_the_mean_rnnt_loss_and_no_head_exists():
    model = _model()
    feats, lens, batch = _batch()
    out, out_lens = model(feats, lens)
    loss, impossible = objective_of(model).train_loss(model, out, out_lens, batch, CPU, TC)
    assert model.ctc_head is None and impossible == 0
    torch.testing.assert_close(loss, _rnnt_reference(model, out, out_lens, batch).mean(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("weight", [0.3, 0.5])
def test_ctc_weight_interpolates_the_heads_ctc_loss_over_its_possible_utterances(weight):
    model = _model(ctc_weight=weight)
    feats, lens, batch = _batch()
    out, out_lens = model(feats, lens)
    assert out_lens.tolist() == [6, 3]
    loss, impossible = objective_of(model).train_loss(model, out, out_lens, batch, CPU, TC)
    assert impossible == 0  # the RNN-T loss trains both utterances
    log_probs = (out @ model.ctc_head.weight.T + model.ctc_head.bias).log_softmax(-1)  # (B, T', V)
    ctc = F.ctc_loss(log_probs[:1].transpose(0, 1), torch.tensor([3, 1]), out_lens[:1], torch.tensor([2]),
                     reduction="sum")  # the first utterance only: the second's 4 labels need 4 frames
    want = (1 - weight) * _rnnt_reference(model, out, out_lens, batch).mean() + weight * ctc
    torch.testing.assert_close(loss, want, rtol=1e-5, atol=1e-5)
    loss.backward()
    assert model.ctc_head.weight.grad.abs().sum() > 0 and model.out.weight.grad.abs().sum() > 0


def test_the_head_leaves_the_other_parameters_initial_values_unchanged():
    """The head is made last: a run without it (every existing transducer preset) draws the same
    initial values as before the option existed, and one with it the same for every other parameter."""
    plain, aux = _model().state_dict(), _model(ctc_weight=0.3).state_dict()
    assert set(aux) - set(plain) == {"ctc_head.weight", "ctc_head.bias"}
    assert all(torch.equal(plain[k], aux[k]) for k in plain)


def test_the_probe_loss_reaches_the_ctc_head():
    """Warm-up and the FLOP count differentiate the probe: with the head, it runs too."""
    model = _model(ctc_weight=0.3)
    feats, lens, _ = _batch()
    out, out_lens = model(feats, lens)
    objective_of(model).probe_loss(model, out, out_lens).backward()
    assert model.ctc_head.weight.grad is not None and model.ctc_head.weight.grad.abs().sum() > 0
