"""The op trace: every ATen op, its shapes and the digest of what it wrote; where two traces part."""
import hashlib

import torch
import torch.nn.functional as F

from speechperf.hardware import op_trace as ot


def traced(fn):
    with ot.OpTrace() as t:
        fn()
    return t.ops


def step(seed: int = 1, bump: bool = False):
    """A small training step: a Linear, an LSTM, a CTC loss, backward and an AdamW step."""
    torch.manual_seed(seed)
    lin, lstm = torch.nn.Linear(6, 8), torch.nn.LSTM(8, 5)
    opt = torch.optim.AdamW([*lin.parameters(), *lstm.parameters()], lr=0.1)
    x = torch.randn(7, 2, 6)
    h = lin(x)
    if bump:  # one unit in the last place in one op's output: what a kernel summing otherwise does
        h = torch.nextafter(h, torch.full_like(h, float("inf")))
    y, _ = lstm(h)
    loss = F.ctc_loss(y.log_softmax(-1), torch.tensor([[1, 2], [3, 3]]), torch.tensor([7, 7]), torch.tensor([2, 2]))
    loss.backward()
    opt.step()


def test_a_trace_is_the_same_twice_and_names_each_op_with_its_input_shapes():
    a, b = traced(step), traced(step)
    assert a == b and len(a) > 50
    names = [op for op, _, _ in a]
    assert "aten.addmm.default" in names and any(n.startswith("aten._ctc_loss.") for n in names)
    addmm = next(o for o in a if o[0] == "aten.addmm.default")
    assert addmm[1] == "8,14x6,6x8"  # bias, input (7*2 x 6), weight transposed


def test_an_op_digest_is_the_sha256_of_its_output_bytes_and_a_view_has_none():
    x = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    ops = traced(lambda: torch.mm(x, x.t()))
    want = hashlib.sha256(torch.mm(x, x.t()).numpy().tobytes()).hexdigest()[:ot.DIGITS]
    assert ops == [["aten.t.default", "2x3", "="], ["aten.mm.default", "2x3,3x2", want]]


def test_in_place_and_out_ops_are_digested_by_what_they_wrote():
    x, y = torch.zeros(3), torch.ones(3)
    a = traced(lambda: x.add_(y))
    x2 = torch.zeros(3)
    b = traced(lambda: x2.add_(2 * y))  # mul then add_: add_ wrote other values
    assert a[0][0] == "aten.add_.Tensor" and b[-1][0] == "aten.add_.Tensor" and a[0][2] != b[-1][2]
    out = torch.empty(3)
    c = traced(lambda: torch.add(y, y, out=out))
    assert c[0][2] == hashlib.sha256((2 * y).numpy().tobytes()).hexdigest()[:ot.DIGITS]


def test_uninitialized_memory_and_scratch_outputs_are_not_digested():
    ops = traced(lambda: torch.empty(1000).detach())  # a view of unwritten memory: neither is digested
    assert ops == [["aten.empty.memory_format", "", "-"], ["aten.detach.default", "1000", "="]]
    torch.manual_seed(3)
    lstm = torch.nn.LSTM(4, 3)  # oneDNN's RNN on a CPU build: a workspace output, partly unwritten
    x = torch.randn(5, 2, 4)
    a, b = traced(lambda: lstm(x)), traced(lambda: lstm(x))
    assert a == b


def test_first_difference_names_the_op_that_computes_otherwise_and_counts_the_contagion():
    a, b = traced(step), traced(lambda: step(bump=True))
    assert ot.first_difference(a, a) is None
    d = ot.first_difference(a, b)
    assert d["kind"] == "sequence"  # the bump is an op of its own (nextafter) where the other ran the LSTM
    # the same sequence with one op's values changed: "values", and everything after it is counted
    c = [list(o) for o in a]
    k = next(i for i, o in enumerate(c) if o[0] == "aten.addmm.default")
    c[k][2] = "0" * ot.DIGITS
    d = ot.first_difference(a, c)
    assert d == {"index": k, "mine": a[k], "theirs": c[k], "kind": "values", "differing": 1}
    shorter = ot.first_difference(a, a[:-2])
    assert shorter["index"] == len(a) - 2 and shorter["theirs"] is None and shorter["differing"] == 2
    assert ot.trace_digest(a) == ot.trace_digest([list(o) for o in a]) != ot.trace_digest(c)


def test_torchs_cpu_dropout_is_an_op_whose_code_follows_the_maker_and_speechperfs_is_not():
    """ATen's bernoulli_(p) draws with MKL on an Intel CPU only: F.dropout and SDPA's dropout call it."""
    from speechperf.models.dropout import dropout
    x = torch.randn(4, 8, requires_grad=True)
    q = x[None, None]
    assert ot.by_maker(traced(lambda: F.dropout(x, 0.1, True).sum().backward())) == {"aten.bernoulli_.float": 1}
    assert ot.by_maker(traced(lambda: F.scaled_dot_product_attention(q, q, q, dropout_p=0.2))) == {
        "aten.bernoulli_.float": 1}
    assert ot.by_maker(traced(lambda: dropout(x, 0.1, True).sum().backward())) == {}
    assert ot.by_maker(traced(step)) == {}
