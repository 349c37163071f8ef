"""``fsdp`` with ``train.system.precision=fp8`` (torchao's float8 Linear layers, emulated on the CPU): on 2 gloo
processes through the loop's own step it equals DDP (``sync``) with the same swapped model on the same
batches, each float8 cast made on the whole gathered weight; its whole state is the plain model's keys,
plain tensors."""
import dataclasses

import pytest
import torch

from speechperf import algorithms as A
from speechperf.config import load_preset
from speechperf.drive.sweep import free_port
from speechperf.models import build_model, fp8
from speechperf.train.step import make_optimizer, train_step
from tests import forked_cli
from tests.algorithms.test_fsdp import batch

WORLD, STEPS = 2, 4
CONFORMER = ["model.name=conformer", "model.d_model=16", "model.layers=1", "model.heads=2", "model.conv_kernel=3",
             "model.subsampling_channels=4", "model.dropout=0", "model.attention_dropout=0"]  # no draws: DDP's = FSDP's
CFG = load_preset("tiny", CONFORMER)
TC = dataclasses.replace(CFG.train, optim=dataclasses.replace(CFG.train.optim, name="adamw", lr=0.003, grad_clip=5.0),
                         system=dataclasses.replace(CFG.train.system, device="cpu", precision="fp8"))
CPU = torch.device("cpu")


def core():
    torch.manual_seed(0)
    model = build_model(CFG.model)
    fp8.prepare(model, "fp8", CPU)
    return model


def train(model, opt, rank):
    scaler = torch.amp.GradScaler("cuda", enabled=False)
    return [float(train_step(model, batch(rank, s), opt, scaler, CPU, TC).loss) for s in range(STEPS)]


def worker(rank, port, out):
    forked_cli.in_group(rank, WORLD, port, _runs, out)


def _runs(rank, out):
    res = {}
    m = core()
    ddp = A.make_algorithm(A.algo_config({"name": "sync"}), WORLD, rank).wrap(m)
    res["sync"] = train(ddp, make_optimizer(m, TC, CPU), rank)
    res["sync_model"] = {k: v.clone() for k, v in m.state_dict().items()}
    algo = A.make_algorithm(A.algo_config({"name": "fsdp"}), WORLD, rank, train=TC)
    model = algo.wrap(core())
    opt = make_optimizer(model, TC, CPU)
    res["fsdp"] = train(model, opt, rank)
    res["swapped"] = fp8.swapped(algo.core)
    res["whole"] = algo.whole_state(opt)[0]
    torch.save(res, f"{out}/rank{rank}.pt")


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    out = tmp_path_factory.mktemp("fsdp_fp8")
    forked_cli.start_processes(worker, (free_port(), str(out)), WORLD)
    return [torch.load(out / f"rank{r}.pt", weights_only=True) for r in range(WORLD)]


def test_fsdp_in_fp8_equals_ddp_in_fp8(ranks):
    r0, r1 = ranks
    assert r0["swapped"] == r1["swapped"] == 9  # the tiny conformer's: all but the 30-class head
    for r in ranks:  # each rank's loss on its own batches, step after step
        assert r["fsdp"] == pytest.approx(r["sync"], rel=1e-5)
    plain = build_model(CFG.model).state_dict()
    assert r0["whole"].keys() == plain.keys()  # the plain model's keys: a checkpoint any precision reads
    assert all(type(v) is torch.Tensor for v in r0["whole"].values())  # noqa: E721 (no torchao subclass)
    for k, v in r0["whole"].items():
        assert torch.allclose(v, r0["sync_model"][k], rtol=1e-4, atol=1e-6), k
