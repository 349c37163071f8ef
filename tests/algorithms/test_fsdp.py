"""``fsdp`` (speechperf/algorithms/fsdp.py): FSDP2 on 2 gloo processes through the loop's own step
(train/step.py: AdamW, gradient clipping, the masked step) equals DDP (``sync``) on the same
batches; its whole state resumes exactly, at the world that wrote it and at another; its
communication counted per step; the shard rule and the config's refusals in-process."""
import dataclasses
import math

import pytest
import torch
import torch.distributed as dist

from speechperf import algorithms as A
from speechperf.algorithms.fsdp import FSDP, shard_units
from speechperf.config import ConfigError, load_preset
from speechperf.data.loader import Batch
from speechperf.drive.sweep import free_port
from speechperf.models import build_model, model_config
from speechperf.train.step import make_optimizer, train_step
from tests import forked_cli

WORLD, STEPS = 2, 5
TINY = load_preset("tiny")
TC = dataclasses.replace(TINY.train, optim=dataclasses.replace(TINY.train.optim, name="adamw", lr=0.003, grad_clip=5.0),
                         system=dataclasses.replace(TINY.train.system, device="cpu"))


def batch(rank: int, step: int, nan: bool = False) -> Batch:
    """Rank ``rank``'s batch of step ``step``: 3 utterances of up to 60 frames, 4-8 labels each."""
    g = torch.Generator().manual_seed(100 * rank + step)
    feats = torch.randn(3, 60, 93, generator=g)  # (B, T, F)
    if nan:
        feats[0, 0, 0] = float("nan")
    lens = torch.tensor([60, 52, 45])
    label_lens = torch.randint(4, 9, (3,), generator=g)
    labels = torch.randint(2, 28, (int(label_lens.sum()),), generator=g)
    return Batch(feats, lens, labels, label_lens, ["a", "b", "c"], ["", "", ""], 1.0)


def core(seed: int = 0):
    torch.manual_seed(seed)
    return build_model(TINY.model)


def train(model, opt, rank, steps, tc=TC, algo=None):
    """The loop's step on this rank's batches; (losses, bytes counted per step)."""
    scaler = torch.amp.GradScaler("cuda", enabled=False)
    losses, comm = [], []
    for s in steps:
        out = train_step(model, batch(rank, s), opt, scaler, torch.device("cpu"), tc)
        losses.append(float(out.loss))
        comm.append(algo.comm.take()[1] if algo is not None else 0)
    return losses, comm


def fsdp(rank, seed=0, world=WORLD, **cfg):
    algo = A.make_algorithm(A.algo_config({"name": "fsdp", **cfg}), world, rank, train=TC)
    model = algo.wrap(core(seed))
    return algo, model, make_optimizer(model, TC, torch.device("cpu"))


def whole(algo, opt):
    model, optimizer = algo.whole_state(opt)
    return {"model": model, "optimizer": optimizer}


def _copy_moves(algo) -> list[str]:
    """Where rank 0's evaluation copy is sent: to the run's device for an evaluation, to the host after."""
    moves = []
    if algo.replica is not None:  # rank 0's
        to = algo.replica.to
        algo.replica.to = lambda device: moves.append(str(device)) or to(device)
    algo.before_eval(STEPS)  # every rank: a collective
    algo.after_eval()
    return moves


def worker(rank, port, out):
    forked_cli.in_group(rank, WORLD, port, _runs, out)


def _runs(rank, out):
    res = {}
    sync = A.make_algorithm(A.algo_config({"name": "sync"}), WORLD, rank)
    m = core()
    ddp = sync.wrap(m)
    res["sync"] = train(ddp, make_optimizer(m, TC, torch.device("cpu")), rank, range(STEPS))[0]
    res["sync_model"] = {k: v.clone() for k, v in m.state_dict().items()}
    algo, model, opt = fsdp(rank)
    res["fsdp"], res["fsdp_comm"] = train(model, opt, rank, range(STEPS), algo=algo)
    res["whole"] = whole(algo, opt)
    evaluated = algo.before_eval(STEPS)  # every rank (a collective); rank 0's plain copy
    res["eval"] = {k: v.clone() for k, v in evaluated.state_dict().items()} if rank == 0 else None
    res["copy_moves"] = _copy_moves(algo)
    algo, model, opt = fsdp(rank, checkpoint_blocks=True, reshard_after_forward=False)
    res["ckpt_blocks"], res["ckpt_blocks_comm"] = train(model, opt, rank, range(STEPS), algo=algo)
    # resumed after 3 steps from the whole state as a checkpoint holds it (torch.save, read as data)
    algo, model, opt = fsdp(rank)
    train(model, opt, rank, range(3))
    if rank == 0:
        torch.save(whole(algo, opt), f"{out}/ckpt.pt")
    else:
        whole(algo, opt)
    dist.barrier()
    saved = torch.load(f"{out}/ckpt.pt", weights_only=True)
    algo, model, opt = fsdp(rank, seed=7)  # another start: everything comes from the checkpoint
    algo.load_whole_state(saved["model"], saved["optimizer"], opt)
    res["resumed"] = train(model, opt, rank, range(3, STEPS))[0]
    res["resumed_whole"] = whole(algo, opt)
    res["masked"] = _masked(rank)
    res["sgd"] = _stateless(rank)
    torch.save(res, f"{out}/rank{rank}.pt")


def _masked(rank) -> dict:
    """A step whose batch holds a NaN on rank 1 only: undone on every rank (the global gradient
    norm is NaN everywhere), with the default and the fused AdamW."""
    out = {}
    for impl in ("default", "fused"):
        tc = dataclasses.replace(TC, optim=dataclasses.replace(TC.optim, impl=impl))
        algo = A.make_algorithm(A.algo_config({"name": "fsdp"}), WORLD, rank, train=tc)
        model = algo.wrap(core())
        opt = make_optimizer(model, tc, torch.device("cpu"))
        train(model, opt, rank, range(2), tc)
        before = whole(algo, opt)
        scaler = torch.amp.GradScaler("cuda", enabled=False)
        step = train_step(model, batch(rank, 2, nan=rank == 1), opt, scaler, torch.device("cpu"), tc)
        out[impl] = {"bad": bool(step.bad), "before": before, "after": whole(algo, opt)}
    return out


def _stateless(rank) -> dict:
    """Plain SGD (no state): its whole state resumed (torch's loader alone refuses it)."""
    tc = dataclasses.replace(TC, optim=dataclasses.replace(TC.optim, name="sgd", lr=0.001))
    states = []
    for seed in (0, 7):
        algo = A.make_algorithm(A.algo_config({"name": "fsdp"}), WORLD, rank, train=tc)
        model = algo.wrap(core(seed))
        opt = make_optimizer(model, tc, torch.device("cpu"))
        if states:  # every rank reads the checkpoint rank 0 wrote
            box = [states[0]]
            dist.broadcast_object_list(box, src=0)
            algo.load_whole_state(box[0]["model"], box[0]["optimizer"], opt)
        else:
            train(model, opt, rank, range(2), tc)
        states.append(whole(algo, opt))
    return {"saved": states[0], "resumed": states[1]}


def one_rank(rank, out):
    """World 1 (a group of its own): the 2-rank checkpoint resharded, read back whole, one step."""
    torch.set_num_threads(1)
    saved = torch.load(f"{out}/ckpt.pt", weights_only=True)
    algo, model, opt = fsdp(0, seed=7, world=1)
    algo.load_whole_state(saved["model"], saved["optimizer"], opt)
    back = whole(algo, opt)
    losses = train(model, opt, 0, range(3, 4))[0]
    algo.close()
    left = dist.is_initialized()
    stepping = A.make_algorithm(A.algo_config({"name": "fsdp"}), 1, 0, train=TC)
    stepping.evaluates = False  # bench scale's: no host copy to evaluate
    stepping.wrap(core())
    try:
        stepping.before_eval(0)
        refused = None
    except RuntimeError as e:
        refused = str(e)
    stepping.close()
    torch.save({"back": back, "losses": losses, "group_left": left, "no_copy": stepping.replica is None,
                "refused": refused}, f"{out}/one.pt")


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    out = tmp_path_factory.mktemp("fsdp")
    forked_cli.start_processes(worker, (free_port(), str(out)), WORLD)
    forked_cli.start_processes(one_rank, (str(out),), 1)
    return [torch.load(out / f"rank{r}.pt") for r in range(WORLD)], torch.load(out / "one.pt")


def _same(a, b, where=""):
    if isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for k in a:
            _same(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            _same(x, y, f"{where}[{i}]")
    elif torch.is_tensor(a):
        assert torch.equal(a, b), where
    else:
        assert a == b, where


def test_fsdp_equals_ddp_on_the_same_batches(ranks):
    (r0, r1), _ = ranks
    for r in (r0, r1):  # every rank's own loss, 5 steps of AdamW, the global norm clipped (about 90 > 5)
        assert len(r["fsdp"]) == STEPS
        for a, b in zip(r["fsdp"], r["sync"]):
            assert abs(a - b) <= 1e-5 * abs(b), (r["fsdp"], r["sync"])
    model = r0["whole"]["model"]
    assert model.keys() == r0["sync_model"].keys()  # the unsharded model's own names
    # conv.bias: a batch norm follows, its gradient is rounding alone, which AdamW's normalization turns
    # into steps of lr either way (and the batch norm's running mean holds it)
    for k, v in r0["sync_model"].items():
        if k not in ("conv.bias", "conv_bn.bn.running_mean"):
            assert torch.allclose(model[k], v, rtol=1e-4, atol=1e-6), k
    moved = sum(float((model[k] - v).abs().sum()) for k, v in core().state_dict().items() if v.is_floating_point())
    assert moved > 0  # the test can fail: the model trained
    assert r1["whole"]["model"] == {}  # gathered to rank 0 only
    _same(r0["eval"], model)  # rank 0 evaluates the gathered model
    # on the run's device for the evaluation, in host memory after it (here both are the CPU); rank 1 has none
    assert r0["copy_moves"] == ["cpu", "cpu"] and r1["copy_moves"] == []


def test_activation_checkpointing_changes_no_number(ranks):
    (r0, r1), _ = ranks
    assert r0["ckpt_blocks"] == r0["fsdp"] and r1["ckpt_blocks"] == r1["fsdp"]


def _padded_bytes(module, world) -> int:
    """fp32 bytes of ``module``'s parameters with each one's first dimension padded to the world
    (FSDP2 shards dim 0 evenly)."""
    return sum(4 * math.ceil(p.shape[0] / world) * world * (p.numel() // p.shape[0]) for p in module.parameters())


def test_communication_counted_per_step_from_the_shards(ranks):
    (r0, r1), _ = ranks
    m = core()
    units = shard_units(m, 0.1)
    assert [type(u).__name__ for u in units] == ["Conv1d", "LSTM"]  # DS2: the big convolution, the LSTMs
    unit_bytes = sum(_padded_bytes(u, WORLD) for u in units)
    everything = _padded_bytes(m, WORLD)
    root = everything - unit_bytes
    # per step: each unit gathered for its forward and again for its backward (resharded after the
    # forward), the root once; every gradient reduce-scattered once
    assert r0["fsdp_comm"] == r1["fsdp_comm"] == [2 * unit_bytes + root + everything] * STEPS
    assert r0["ckpt_blocks_comm"] == [unit_bytes + root + everything] * STEPS  # kept gathered: one gather each


def test_whole_state_resumes_exactly_at_its_world_and_at_another(ranks):
    (r0, r1), one = ranks
    assert r0["resumed"] == r0["fsdp"][3:] and r1["resumed"] == r1["fsdp"][3:]  # bit for bit
    sgd = r0["sgd"]  # a stateless optimizer too (an empty state per parameter, or none)
    _same(sgd["resumed"]["model"], sgd["saved"]["model"])
    _same(sgd["resumed"]["optimizer"]["param_groups"], sgd["saved"]["optimizer"]["param_groups"])
    assert not any(sgd["resumed"]["optimizer"]["state"].values())
    assert not any(sgd["saved"]["optimizer"]["state"].values())
    _same(r0["resumed_whole"], r0["whole"])  # the model and AdamW's moments and steps
    assert set(r0["whole"]["optimizer"]["state"]) == set(r0["whole"]["model"]) - {
        k for k in r0["whole"]["model"] if "running" in k or "num_batches" in k}
    assert not one["group_left"]  # close() ends the group the algorithm made
    assert one["no_copy"] and one["refused"] == ("fsdp: rank 0 was wrapped with evaluates=False and has no copy to "
                                                 "evaluate")
    assert one["losses"] and math.isfinite(one["losses"][0])


def test_a_nonfinite_step_is_undone_on_every_rank(ranks):
    (r0, r1), _ = ranks
    for impl in ("default", "fused"):
        assert r0["masked"][impl]["bad"] and r1["masked"][impl]["bad"], impl
        _same(r0["masked"][impl]["after"], r0["masked"][impl]["before"], impl)


def test_the_shard_rule_picks_the_repeated_blocks():
    cfg = model_config({"name": "conformer", "d_model": 16, "layers": 3, "heads": 2, "conv_kernel": 3,
                        "subsampling_channels": 4})
    m = build_model(cfg)
    units = shard_units(m, 0.1)
    assert [u for u in units if u in list(m.blocks)] == list(m.blocks)  # every block its own unit
    assert m.head not in units
    names = A.algo_config({"name": "fsdp", "shard_modules": "blocks,head"})
    from speechperf.algorithms.fsdp import named_units

    assert named_units(m, names.shard_modules) == [*m.blocks, m.head]
    with pytest.raises(ConfigError, match="no module 'nope'.*blocks"):
        named_units(m, "nope")


def test_config_problems_and_refused_launches():
    assert A.algo_config({"name": "fsdp", "shard_share": 0}).problems() == [
        "algo.shard_share=0.0 must be in (0, 1]"]
    assert "algo.shard_modules=' , '" in A.algo_config({"name": "fsdp", "shard_modules": " , "}).problems()[0]
    algo = A.algo_config({"name": "fsdp"})
    A.check_launch(algo, 1, TC)  # one process: allowed (nothing sharded; checkpointing and mixed precision)
    for field, value, said in [("compile", True, "train.system.compile=true"),
                               ("cuda_graphs", True, "train.system.cuda_graphs"),
                               ("precision", "fp16", "train.system.precision=fp16")]:
        with pytest.raises(ConfigError, match=f"algo.name=fsdp does not train with {said}"):
            A.check_launch(algo, 2, dataclasses.replace(TC, system=dataclasses.replace(TC.system, **{field: value})))
    assert FSDP.shards and not A.algorithm_class("sync").shards


class Tied(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)
        self.b.weight = self.a.weight  # one parameter in two places
        self.register_buffer("count", torch.arange(3))
        self.a.bias.requires_grad_(False)


def test_rank_0s_evaluation_copy_is_made_in_host_memory_tensor_by_tensor():
    from speechperf.algorithms.fsdp import host_copy

    m = Tied()
    c = host_copy(m)
    assert c.b.weight is c.a.weight and c.a.weight is not m.a.weight  # shared stays shared, nothing aliases m
    assert isinstance(c.a.weight, torch.nn.Parameter) and not c.a.bias.requires_grad and c.a.weight.requires_grad
    for (k, x), (_, y) in zip(m.state_dict().items(), c.state_dict().items()):
        assert torch.equal(x, y) and y.device.type == "cpu" and x.data_ptr() != y.data_ptr(), k


@pytest.mark.cuda
def test_the_host_copy_allocates_nothing_on_the_gpu():
    from speechperf.algorithms.fsdp import host_copy

    m = torch.nn.Sequential(*[torch.nn.Linear(1024, 1024) for _ in range(8)]).cuda()  # 33.6 MB
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    c = host_copy(m)
    assert torch.cuda.max_memory_allocated() == before  # deepcopy(m).to("cpu") would add 33.6 MB here
    assert all(p.device.type == "cpu" for p in c.parameters())
