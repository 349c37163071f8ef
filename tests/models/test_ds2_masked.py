"""DeepSpeech2.masked: the forward pass of static shapes a CUDA graph captures (train/graphs.py)
is the indexed one, batch norms and all: outputs, gradients, running statistics, eval mode."""
import pytest
import torch

from speechperf.models.ds2 import DS2Config, DeepSpeech2, MaskedBatchNorm


def _pair():
    torch.manual_seed(0)
    cfg = DS2Config(conv_channels=16, lstm_layers=2, lstm_hidden=12, dropout=0.0)
    a, b = DeepSpeech2(cfg).double(), DeepSpeech2(cfg).double()
    b.load_state_dict(a.state_dict())
    return a, b


def _padded(model, lens, rows, extra=7):
    """(rows, T + extra, 93) features and their (T'', rows) mask: rows past len(lens) are a
    graph's padding rows (no valid frame), the extra frames its padding frames."""
    x = torch.randn(rows, int(lens.max()) + extra, 93, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    out = model.output_lengths(lens)
    valid = torch.cat([out, torch.zeros(rows - len(out), dtype=out.dtype)])
    frames = int(model.output_lengths(torch.tensor([x.shape[1]]))[0])
    return x, torch.arange(frames)[:, None] < valid[None, :]


@pytest.mark.parametrize("pad_rows", [0, 2])
def test_masked_equals_indexed_in_outputs_gradients_and_statistics(pad_rows):
    a, b = _pair()
    lens = torch.tensor([40, 25, 13])
    x, mask = _padded(b, lens, len(lens) + pad_rows)
    lp, _ = a(x[: len(lens), : int(lens.max())], lens)  # (T', B, C): the plain pass, unpadded
    valid = mask[: lp.shape[0], : len(lens)]
    lp2 = b.masked(x, mask)[: lp.shape[0], : len(lens)]
    assert (lp - lp2)[valid].abs().max() < 1e-12
    lp[valid].sum().backward()
    lp2[valid].sum().backward()
    for (name, p), q in zip(a.named_parameters(), b.parameters()):
        assert torch.allclose(p.grad, q.grad, atol=1e-11, rtol=0), name
    for (name, u), v in zip(a.named_buffers(), b.buffers()):
        assert torch.allclose(u.double(), v.double(), atol=1e-13, rtol=0), name
    a.eval(), b.eval()
    lp, _ = a(x[: len(lens), : int(lens.max())], lens)
    assert (lp - b.masked(x, mask)[: lp.shape[0], : len(lens)])[valid].abs().max() < 1e-12


def test_masked_batch_norm_ignores_what_padding_holds_even_inf():
    torch.manual_seed(0)
    x = torch.randn(6, 3, 4, dtype=torch.float64)
    mask = torch.arange(6)[:, None] < torch.tensor([6, 2, 0])[None, :]  # (T, B): the last row all padding
    bns = [MaskedBatchNorm(4).double() for _ in range(3)]
    clean = bns[0](x, mask=mask)
    dirty = bns[1](torch.where(mask[..., None], x, float("inf")), mask=mask)
    assert torch.isfinite(dirty).all() and torch.equal(clean, dirty) and (dirty[~mask] == 0).all()
    indexed = bns[2](x, mask.reshape(-1).nonzero().squeeze(1))
    assert torch.allclose(indexed, clean, atol=1e-12, rtol=0)
    for u, v, w in zip(*(bn.buffers() for bn in bns)):
        assert torch.equal(u, v) and torch.allclose(u.double(), w.double(), atol=1e-14, rtol=0)
