"""LAMB against the paper's update written out in float64 for one tensor, and under masked_step."""
import math

import torch

from speechperf.train.lamb import Lamb
from speechperf.train.step import masked_step


def _by_hand(p, grads, lr, b1, b2, eps, wd):
    """The paper's Algorithm 2 for one tensor, element by element in Python floats."""
    p, m, v = list(p), [0.0] * len(p), [0.0] * len(p)
    for t, g in enumerate(grads, start=1):
        m = [b1 * mi + (1 - b1) * gi for mi, gi in zip(m, g)]
        v = [b2 * vi + (1 - b2) * gi * gi for vi, gi in zip(v, g)]
        u = [mi / (1 - b1 ** t) / (math.sqrt(vi / (1 - b2 ** t)) + eps) + wd * pi for mi, vi, pi in zip(m, v, p)]
        wn, un = math.sqrt(sum(x * x for x in p)), math.sqrt(sum(x * x for x in u))
        trust = wn / un if wn > 0 and un > 0 else 1.0
        p = [pi - lr * trust * ui for pi, ui in zip(p, u)]
    return p


def test_lamb_matches_the_papers_update():
    start = [0.5, -1.25, 2.0]
    grads = [[0.1, -0.3, 0.2], [0.05, 0.4, -0.1], [-0.2, 0.1, 0.3]]
    p = torch.nn.Parameter(torch.tensor(start, dtype=torch.float64))
    opt = Lamb([p], lr=0.01, betas=(0.9, 0.99), eps=1e-6, weight_decay=0.01)
    for g in grads:
        p.grad = torch.tensor(g, dtype=torch.float64)
        opt.step()
    want = _by_hand(start, grads, 0.01, 0.9, 0.99, 1e-6, 0.01)
    assert torch.allclose(p.detach(), torch.tensor(want, dtype=torch.float64), rtol=0, atol=1e-12)


def test_a_zero_tensor_steps_with_trust_one():
    p = torch.nn.Parameter(torch.zeros(2, dtype=torch.float64))
    opt = Lamb([p], lr=0.1, betas=(0.9, 0.999), eps=1e-8)
    p.grad = torch.tensor([1.0, -1.0], dtype=torch.float64)
    opt.step()
    assert torch.allclose(p.detach(), torch.tensor([-0.1, 0.1], dtype=torch.float64), atol=1e-6)


def test_a_bad_step_is_undone_exactly():
    p = torch.nn.Parameter(torch.tensor([1.0, 2.0]))
    opt = Lamb([p], lr=0.1)
    p.grad = torch.tensor([0.5, 0.5])
    masked_step(opt, torch.tensor(True))
    kept = (p.detach().clone(), {k: v.clone() for k, v in opt.state[p].items()})
    p.grad = torch.tensor([float("nan"), 1.0])
    masked_step(opt, torch.tensor(False))
    assert torch.equal(p.detach(), kept[0])
    assert all(torch.equal(opt.state[p][k], v) for k, v in kept[1].items())
