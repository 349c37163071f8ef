import torch

from speechperf.models.fbank import deltas, stack_context, with_deltas
from speechperf.models import build_model
from speechperf.models.cldnn import CLDNNConfig, cldnn_parameter_count
from speechperf.models.dnn import DNNConfig, dnn_parameter_count
from speechperf.train.newbob import NewBob


def test_dnn_and_cldnn_parameter_counts():
    d = DNNConfig()
    assert d.frame_dim == 40 * 3 * 11 == 1320
    hand = (1320 * 1024 + 1024) + 5 * (1024 * 1024 + 1024) + (1024 * 30 + 30)
    assert dnn_parameter_count(d) == hand == sum(p.numel() for p in build_model(d).parameters())
    c = CLDNNConfig()
    assert cldnn_parameter_count(c) == sum(p.numel() for p in build_model(c).parameters())
    lp, lens = build_model(CLDNNConfig(conv_maps=4, lstm_cells=8, lstm_proj=4, dnn_hidden=8))(
        torch.randn(2, 30, 93), torch.tensor([30, 20]))
    assert lp.shape == (30, 2, 30) and lens.tolist() == [30, 20]


def test_deltas_and_context():
    x = torch.arange(10, dtype=torch.float64).reshape(1, 10, 1).repeat(1, 1, 2)  # a ramp: slope 1
    d = deltas(x)
    assert torch.allclose(d[0, 2:-2], torch.ones(6, 2, dtype=torch.float64))
    assert with_deltas(x).shape == (1, 10, 6)
    c = stack_context(x, 2, 2)
    assert c.shape == (1, 10, 10)
    assert c[0, 5].reshape(5, 2)[:, 0].tolist() == [3, 4, 5, 6, 7]
    assert c[0, 0].reshape(5, 2)[:, 0].tolist() == [0, 0, 0, 1, 2]  # edges replicated


def test_newbob_on_a_scripted_loss_curve():
    nb = NewBob(lr=1.0)
    lrs = [nb.step(loss) for loss in (10.0, 8.0, 7.0, 6.97, 6.5, 6.499)]
    # 8 and 7 improve >= 1%: keep; 6.97 improves 0.4%: start halving; 6.499 improves < 0.1%: stop
    assert lrs == [1.0, 1.0, 1.0, 0.5, 0.25, 0.125]
    assert nb.stop
    assert not NewBob(lr=1.0).stop
