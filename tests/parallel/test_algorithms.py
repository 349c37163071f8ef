"""Equivalences of the parallel algorithms with 2 gloo processes, float64, a tiny model."""
import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from speechperf.errors import SpeechperfError
from torch.nn.utils import vector_to_parameters

from speechperf.parallel.algorithms import AlgoConfig, make_algorithm
from speechperf.parallel.sweep import free_port

WORLD, STEPS, LR = 2, 6, 0.1


def model_fn():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 5), torch.nn.Tanh(), torch.nn.Linear(5, 3)).double()


def batch(rank, step):
    g = torch.Generator().manual_seed(100 * rank + step)
    return torch.randn(8, 4, generator=g, dtype=torch.float64), torch.randn(8, 3, generator=g, dtype=torch.float64)


def sgd_step(model, x, y):
    model.zero_grad()
    torch.nn.functional.mse_loss(model(x), y).backward()
    with torch.no_grad():
        for p in model.parameters():
            p -= LR * p.grad


def flat(model):
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


SCENARIOS = {
    "sync": ("sync", AlgoConfig(), STEPS),
    "bsp1": ("bsp", AlgoConfig(sync_period=1), STEPS),
    "bsp3": ("bsp", AlgoConfig(sync_period=3), STEPS),
    "bmuf_zeta0": ("bmuf", AlgoConfig(sync_period=3, block_momentum=0.0, block_lr=1.0), STEPS),
    "bmuf": ("bmuf", AlgoConfig(sync_period=3, block_momentum=0.5, block_lr=1.0, nesterov=True), STEPS),
    "uneven": ("bsp", AlgoConfig(sync_period=2), None),
}


def worker(rank, port, out):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    torch.set_num_threads(1)
    results = {}
    for key, (name, cfg, steps) in SCENARIOS.items():
        algo = make_algorithm(name, cfg, WORLD)
        model = model_fn()
        if rank == 1:  # different start: setup must broadcast rank 0's model
            with torch.no_grad():
                for p in model.parameters():
                    p.add_(1.0)
        model = algo.setup(model)
        n = steps if steps is not None else (5 if rank == 0 else 3)
        for s in range(n):
            sgd_step(model, *batch(rank, s))
            algo.after_step(model, frames=8)
        algo.finish(model)
        core = model.module if hasattr(model, "module") else model
        if name == "bmuf":
            vector_to_parameters(algo.eval_vector(core), core.parameters())
        results[key] = flat(core)
    torch.save(results, f"{out}/rank{rank}.pt")
    dist.barrier()  # tear down together (a rank leaving early can abort gloo's threads)
    dist.destroy_process_group()


def run_ranks(fn, out):
    """Run ``fn(rank, port, out)`` in WORLD processes; each leaves ``out/rankR.pt``."""
    mp.spawn(fn, args=(free_port(), str(out)), nprocs=WORLD, join=True)
    return [torch.load(out / f"rank{r}.pt") for r in range(WORLD)]


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    return run_ranks(worker, tmp_path_factory.mktemp("par"))


def local_models(steps_per_block, blocks, start):
    """Serial simulation: WORLD local models, each SGD on its own batches, from ``start``."""
    models = []
    for r in range(WORLD):
        m = model_fn()
        torch.nn.utils.vector_to_parameters(start.clone(), m.parameters())
        for s in range(steps_per_block):
            sgd_step(m, *batch(r, blocks * steps_per_block + s))
        models.append(flat(m))
    return models


def test_ddp_equals_single_sgd_on_the_concatenated_batch(ranks):
    m = model_fn()
    for s in range(STEPS):
        xs, ys = zip(*(batch(r, s) for r in range(WORLD)))
        sgd_step(m, torch.cat(xs), torch.cat(ys))
    assert torch.allclose(ranks[0]["sync"], flat(m), atol=1e-12)
    assert torch.equal(ranks[0]["sync"], ranks[1]["sync"])


def test_bsp_tau1_equals_ddp_and_bmuf_zeta0_equals_bsp(ranks):
    assert torch.allclose(ranks[0]["bsp1"], ranks[0]["sync"], atol=1e-12)
    assert torch.allclose(ranks[0]["bmuf_zeta0"], ranks[0]["bsp3"], atol=1e-12)


def test_bsp_tau3_matches_serial(ranks):
    g = flat(model_fn())
    for block in range(STEPS // 3):
        g = torch.stack(local_models(3, block, g)).mean(0)
    assert torch.allclose(ranks[0]["bsp3"], g, atol=1e-12) and torch.allclose(ranks[1]["bsp3"], g, atol=1e-12)


def test_bmuf_nesterov_matches_serial(ranks):
    zeta, eta = 0.5, 1.0
    glob = flat(model_fn())
    delta = torch.zeros_like(glob)
    start = glob
    for block in range(STEPS // 3):
        avg = torch.stack(local_models(3, block, start)).mean(0)
        delta = zeta * delta + eta * (avg - glob)
        glob = glob + delta
        start = glob + zeta * delta
    assert torch.allclose(ranks[0]["bmuf"], glob, atol=1e-12)


def test_uneven_shards_finish_and_agree(ranks):
    assert torch.allclose(ranks[0]["uneven"], ranks[1]["uneven"], atol=1e-12)


def test_bad_configs():
    with pytest.raises(SpeechperfError, match="sync period"):
        make_algorithm("bsp", AlgoConfig(sync_period=0), 2)
    with pytest.raises(SpeechperfError, match="unknown algorithm"):
        make_algorithm("gossip", AlgoConfig(), 2)
    with pytest.raises(SpeechperfError, match="one worker"):
        make_algorithm("single", AlgoConfig(), 2)
