"""The transducer under DDP (``sync``) on 2 gloo processes through the loop's own step: its prediction
and joint networks run outside DDP's forward (objectives/transducer.py calls them on the unwrapped
model), so this shows their gradients are averaged too: after a few steps on different batches every
parameter is the same on both ranks, and equals one process stepping on the mean of both ranks' losses."""
import dataclasses

import pytest
import torch

from speechperf import algorithms as A
from speechperf.config import load_preset
from speechperf.data.loader import Batch
from speechperf.drive.sweep import free_port
from speechperf.models import build_model, model_config
from speechperf.train.step import make_optimizer, train_step
from tests import forked_cli

WORLD, STEPS = 2, 3
TINY = load_preset("tiny").train
TC = dataclasses.replace(TINY, optim=dataclasses.replace(TINY.optim, name="sgd", lr=0.01, grad_clip=0.0),
                         system=dataclasses.replace(TINY.system, device="cpu"))
CFG = model_config({"name": "transducer", "d_model": 32, "layers": 1, "heads": 4, "conv_kernel": 15,
                    "subsampling_channels": 16, "pred_dim": 24, "joint_dim": 20, "dropout": 0.0,
                    "attention_dropout": 0.0, "pred_dropout": 0.0})  # no dropout: one process draws as two would not


def batch(rank: int, step: int) -> Batch:
    """Rank ``rank``'s batch of step ``step``: 2 utterances of up to 48 frames, 3-6 labels each."""
    g = torch.Generator().manual_seed(100 * rank + step)
    label_lens = torch.randint(3, 7, (2,), generator=g)
    return Batch(torch.randn(2, 48, 93, generator=g), torch.tensor([48, 40]),
                 torch.randint(2, 28, (int(label_lens.sum()),), generator=g), label_lens, ["a", "b"], ["", ""], 1.0)


def core():
    torch.manual_seed(0)
    return build_model(CFG)


def worker(rank, port, out):
    forked_cli.in_group(rank, WORLD, port, _steps, out)


def _steps(rank, out):
    sync = A.make_algorithm(A.algo_config({"name": "sync"}), WORLD, rank)
    m = core()
    ddp = sync.wrap(m)
    opt = make_optimizer(m, TC, torch.device("cpu"))
    scaler = torch.amp.GradScaler("cuda", enabled=False)
    for s in range(STEPS):
        train_step(ddp, batch(rank, s), opt, scaler, torch.device("cpu"), TC)
    torch.save({k: v.clone() for k, v in m.state_dict().items()}, f"{out}/rank{rank}.pt")


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    out = tmp_path_factory.mktemp("transducer_ddp")
    forked_cli.start_processes(worker, (free_port(), str(out)), WORLD)
    return [torch.load(out / f"rank{r}.pt", weights_only=True) for r in range(WORLD)]


def _one_process() -> dict:
    """Plain SGD on the mean of both ranks' batch losses: what DDP's averaged gradients give."""
    torch.set_num_threads(1)
    m = core()
    opt = torch.optim.SGD(m.parameters(), lr=TC.optim.lr)
    scaler = torch.amp.GradScaler("cuda", enabled=False)
    for s in range(STEPS):
        grads = []
        for r in range(WORLD):
            opt.zero_grad(set_to_none=True)
            probe = torch.optim.SGD(m.parameters(), lr=0.0)  # a step of lr 0: the gradient alone
            train_step(m, batch(r, s), probe, scaler, torch.device("cpu"), TC)
            grads.append([p.grad.clone() for p in m.parameters()])
        with torch.no_grad():
            for p, *gs in zip(m.parameters(), *grads):
                p -= TC.optim.lr * sum(gs) / WORLD
    return m.state_dict()


def test_every_transducer_parameter_is_averaged_across_ranks(ranks):
    first, second = ranks
    assert first.keys() == second.keys()
    pred = [k for k in first if k.startswith(("pred", "joint"))]
    assert pred  # the prediction and joint networks are in the comparison
    for k in first:
        assert torch.equal(first[k], second[k]), k  # DDP's all-reduce reached it: one model on both ranks
    alone = _one_process()
    for k in first:
        assert torch.allclose(first[k], alone[k], rtol=1e-4, atol=1e-6), k
