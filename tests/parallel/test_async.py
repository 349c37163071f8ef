"""ASGD and EASGD through the rpc parameter server: exact against serial simulations when
the server serves the workers round robin; EASGD exchanges conserve w_i + w~."""
import os

import pytest
import torch
import torch.distributed as dist
import torch.distributed.rpc as rpc
from torch.nn.utils import parameters_to_vector, vector_to_parameters

from speechperf.parallel import server
from speechperf.parallel.algorithms import AlgoConfig, make_algorithm

WORLD, STEPS, LR, ALPHA = 2, 4, 0.1, 0.3
from tests.parallel.test_algorithms import batch, flat, model_fn, run_ranks, sgd_step  # noqa: E402


def test_elastic_exchange_conserves_the_sum_and_alpha_zero_is_inert():
    ps = server.ParameterServer(torch.zeros(5, dtype=torch.float64), workers=1, alpha=0.25)
    local = torch.arange(5, dtype=torch.float64)
    before = local + ps.w
    diff = ps.elastic(0, local)
    assert torch.allclose((local - diff) + ps.w, before)
    frozen = server.ParameterServer(torch.ones(5, dtype=torch.float64), workers=1, alpha=0.0)
    frozen.elastic(0, local)
    assert torch.equal(frozen.w, torch.ones(5, dtype=torch.float64))


def worker(rank, port, out):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    server.start_rpc(rank, WORLD)
    torch.set_num_threads(1)
    results = {}
    for name, tau in (("asgd", 1), ("easgd", 2)):
        algo = make_algorithm(name, AlgoConfig(sync_period=tau, easgd_alpha=ALPHA), WORLD, rank)
        algo.round_robin = True
        model = algo.setup(model_fn())
        for s in range(STEPS):
            sgd_step(model, *batch(rank, s))
            algo.after_step(model, 8)
        dist.barrier()  # every push is in before the final pull
        results[name] = algo.eval_vector(model)
        results[name + "_staleness"] = server.server_staleness() if rank == 0 else None
        dist.barrier()
    torch.save(results, f"{out}/rank{rank}.pt")
    rpc.shutdown()
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    return run_ranks(worker, tmp_path_factory.mktemp("async"))


def _model_at(vec):
    m = model_fn()
    vector_to_parameters(vec.clone(), m.parameters())
    return m


def test_asgd_round_robin_equals_serial_simulation(ranks):
    w = flat(model_fn())
    local = [w.clone() for _ in range(WORLD)]
    for s in range(STEPS):
        for k in range(WORLD):
            m = _model_at(local[k])
            sgd_step(m, *batch(k, s))
            w = w + (flat(m) - local[k])  # the server applies the pushed update
            local[k] = w.clone()  # and the worker pulls the current model
    assert torch.allclose(ranks[0]["asgd"], w, atol=1e-12) and torch.allclose(ranks[1]["asgd"], w, atol=1e-12)
    assert ranks[0]["asgd_staleness"][:2] == [0, 1]  # worker 1's first push was overtaken once


def test_easgd_round_robin_equals_serial_simulation(ranks):
    centre = flat(model_fn())
    local = [centre.clone() for _ in range(WORLD)]
    for s in range(STEPS):
        for k in range(WORLD):
            m = _model_at(local[k])
            sgd_step(m, *batch(k, s))
            local[k] = flat(m)
            if (s + 1) % 2 == 0:
                diff = ALPHA * (local[k] - centre)
                centre = centre + diff
                local[k] = local[k] - diff
    assert torch.allclose(ranks[0]["easgd"], centre, atol=1e-12)
