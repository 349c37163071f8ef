"""The data-parallel algorithms' hooks (speechperf/algorithms) on 2 gloo processes, float64, a
tiny model, against a serial simulation of their update rules; the ``algo`` config section."""
import os
import time

import pytest
import torch
import torch.distributed as dist

from speechperf.config import PRESET_DIR as PRESETS, ConfigError, RunConfig, load_preset
from speechperf.drive.sweep import free_port
from speechperf import algorithms as A
from speechperf.algorithms import param_server
from speechperf.algorithms.bmuf import bmuf_update
from tests import forked_cli

WORLD, STEPS, LR = 2, 6, 0.1


def cfg(**values):
    """The config of the algorithm ``values["name"]`` names, as a preset's [algo] section reads."""
    return A.algo_config(values)


def model_fn():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 5), torch.nn.Tanh(), torch.nn.Linear(5, 3)).double()


def batch(rank, step):
    g = torch.Generator().manual_seed(100 * rank + step)
    return torch.randn(8, 4, generator=g, dtype=torch.float64), torch.randn(8, 3, generator=g, dtype=torch.float64)


def optimizer(name, model):
    if name == "adamw":
        return torch.optim.AdamW(model.parameters(), lr=0.01)
    return torch.optim.SGD(model.parameters(), lr=LR)


def step(model, opt, x, y):
    opt.zero_grad()
    torch.nn.functional.mse_loss(model(x), y).backward()
    opt.step()


def flat(model):
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


# name -> (algo config, local optimizer, steps, batches_done at the evaluation: a partial last block when not
# a multiple of sync_every)
SCENARIOS = {
    "sync": (cfg(name="sync"), "sgd", STEPS, STEPS),
    "bsp1": (cfg(name="bsp", sync_every=1), "sgd", STEPS, STEPS),
    "bsp3": (cfg(name="bsp", sync_every=3), "sgd", STEPS, STEPS),
    "bmuf": (cfg(name="bmuf", sync_every=3, block_momentum=0.5), "sgd", STEPS, STEPS),
    "bmuf_classic": (cfg(name="bmuf", sync_every=3, block_momentum=0.5, nesterov=False), "adamw", STEPS,
                     STEPS),
    "diloco": (cfg(name="diloco", sync_every=3), "adamw", 7, 7),  # 2 blocks of 3, then one of 1
}


def worker(rank, port, out):
    forked_cli.in_group(rank, WORLD, port, _scenarios, out)


def _scenarios(rank, out):
    results = {}
    for key, (cfg, opt_name, steps, done) in SCENARIOS.items():
        core = model_fn()
        if rank == 1:  # another start: wrap must give every rank rank 0's model
            with torch.no_grad():
                for p in core.parameters():
                    p.add_(1.0)
        algo = A.make_algorithm(cfg, WORLD, rank)
        model = algo.wrap(core)
        opt = optimizer(opt_name, core)
        for s in range(steps):
            step(model, opt, *batch(rank, s))
            algo.after_step(s + 1)
        evaluated = algo.before_eval(done)
        results[key] = {"local": flat(core), "eval": flat(evaluated), "comm": (algo.comm.seconds, algo.comm.bytes)}
    core = model_fn()  # DDP as the loop ran it before the hooks, without the counting comm hook
    plain = torch.nn.parallel.DistributedDataParallel(core)
    opt = optimizer("sgd", core)
    for s in range(STEPS):
        step(plain, opt, *batch(rank, s))
    results["ddp_plain"] = {"local": flat(core)}
    torch.save(results, f"{out}/rank{rank}.pt")


def _spawned(fn, out):
    """Every rank's results of ``fn`` run on WORLD gloo processes (forked from the suite's preloaded
    server), each saved to ``out/rankR.pt``."""
    forked_cli.start_processes(fn, (free_port(), str(out)), WORLD)
    return [torch.load(out / f"rank{r}.pt") for r in range(WORLD)]


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    return _spawned(worker, tmp_path_factory.mktemp("algo"))


class Workers:
    """The serial reference: WORLD local models and optimizers, each on its own batches."""

    def __init__(self, opt_name: str):
        self.models = [model_fn() for _ in range(WORLD)]
        self.opts = [optimizer(opt_name, m) for m in self.models]

    def train(self, steps):
        for r, (m, o) in enumerate(zip(self.models, self.opts)):
            for s in steps:
                step(m, o, *batch(r, s))

    def mean(self):
        return torch.stack([flat(m) for m in self.models]).mean(0)

    def restart(self, start):
        for m in self.models:
            torch.nn.utils.vector_to_parameters(start.clone(), m.parameters())


def test_sync_is_ddp_unchanged_and_the_mean_gradient_step(ranks):
    assert torch.equal(ranks[0]["sync"]["local"], ranks[0]["ddp_plain"]["local"])  # the comm hook changes nothing
    m = model_fn()
    opt = optimizer("sgd", m)
    for s in range(STEPS):
        xs, ys = zip(*(batch(r, s) for r in range(WORLD)))
        step(m, opt, torch.cat(xs), torch.cat(ys))
    assert torch.allclose(ranks[0]["sync"]["local"], flat(m), atol=1e-12)
    seconds, nbytes = ranks[0]["sync"]["comm"]
    params = sum(p.numel() for p in m.parameters())
    assert nbytes == STEPS * params * 8 and seconds > 0  # every gradient all-reduced once per step, float64


def test_bsp_every_step_equals_sync(ranks):
    assert torch.allclose(ranks[0]["bsp1"]["local"], ranks[0]["sync"]["local"], atol=1e-12)


def test_bsp_matches_serial_averaging(ranks):
    w = Workers("sgd")
    for block in range(STEPS // 3):
        w.train(range(3 * block, 3 * block + 3))
        w.restart(w.mean())
    for r in range(WORLD):
        assert torch.allclose(ranks[r]["bsp3"]["local"], flat(w.models[0]), atol=1e-12)
    assert ranks[0]["bsp3"]["comm"][1] == 2 * flat(w.models[0]).numel() * 8  # two syncs of the parameters


def _bmuf_reference(opt_name, zeta, nesterov):
    w, eta = Workers(opt_name), 1.0
    glob = flat(w.models[0])
    delta = torch.zeros_like(glob)
    start = glob
    for block in range(STEPS // 3):
        w.train(range(3 * block, 3 * block + 3))
        delta = zeta * delta + eta * (w.mean() - start)  # Eq. 4, G = mean - the block's start (Eq. 3 under CBM)
        glob = glob + delta  # Eq. 5
        start = glob + zeta * delta if nesterov else glob  # NBM: the workers continue from the look-ahead
        w.restart(start)
    return glob, flat(w.models[0])


def test_bmuf_matches_serial_block_updates(ranks):
    glob, start = _bmuf_reference("sgd", 0.5, nesterov=True)
    for r in range(WORLD):
        assert torch.allclose(ranks[r]["bmuf"]["eval"], glob, atol=1e-12)  # the global model is evaluated
        assert torch.allclose(ranks[r]["bmuf"]["local"], start, atol=1e-12)  # the workers continue from the look-ahead
    glob, start = _bmuf_reference("adamw", 0.5, nesterov=False)
    assert torch.allclose(ranks[0]["bmuf_classic"]["eval"], glob, atol=1e-12)
    assert torch.allclose(ranks[0]["bmuf_classic"]["local"], glob, atol=1e-12)


@pytest.mark.parametrize("nesterov", [True, False])
def test_bmuf_without_progress_lets_its_momentum_decay(nesterov):
    """Workers that make no progress in a block hand back the model they started from: Delta
    then shrinks by the momentum each block (it grew by 2 x momentum with NBM's G measured from
    the global model, and a 2-worker run diverged)."""
    glob, delta = torch.zeros(1), torch.ones(1)
    start = glob + 0.6 * delta if nesterov else glob
    for block in range(1, 6):
        glob, delta, start = bmuf_update(glob, delta, start, block_lr=1.0, momentum=0.6, nesterov=nesterov)
        assert delta.item() == pytest.approx(0.6 ** block)


def test_bmuf_default_block_momentum_is_eq_6():
    algo = A.make_algorithm(cfg(name="bmuf"), world=4)
    assert algo.momentum == pytest.approx(1 - 1 / (4 * 1.05))


def test_diloco_matches_serial_outer_nesterov_sgd(ranks):
    lr, mu = 0.7, 0.9
    w = Workers("adamw")  # the inner optimizer keeps its moments across blocks, per worker
    glob = flat(w.models[0])
    buf = None
    for steps in (range(0, 3), range(3, 6), range(6, 7)):  # the last block: the epoch's end (before_eval)
        w.train(steps)
        g = glob - w.mean()  # the pseudo-gradient
        buf = g.clone() if buf is None else mu * buf + g  # torch SGD's momentum buffer (no dampening)
        glob = glob - lr * (g + mu * buf)  # Nesterov
        w.restart(glob)
    for r in range(WORLD):
        assert torch.allclose(ranks[r]["diloco"]["local"], glob, atol=1e-12)
        assert torch.allclose(ranks[r]["diloco"]["eval"], glob, atol=1e-12)


def test_the_algo_section_is_loaded_stored_and_validated():
    conf = load_preset("tiny", ["algo.sync_every=20", "algo.name=bmuf", "sync_every=3"])
    assert (conf.algo.name, conf.algo.sync_every, conf.train.system.sync_every) == ("bmuf", 20, 3)  # bare: the loop's
    assert RunConfig.from_dict(conf.to_dict()) == conf and conf.to_dict()["algo"]["name"] == "bmuf"
    assert type(conf.algo).__name__ == "BMUFConfig" and conf.algo.bmuf_c == 1.05  # the algorithm's own config
    assert RunConfig.from_dict({"preset": "tiny"}).algo == cfg(name="sync")  # no [algo] section: sync
    with pytest.raises(ConfigError, match="algo.name='gossip' is unknown; known: single, sync, bsp, bmuf, diloco, asgd, easgd"):
        load_preset("tiny", ["algo.name=gossip"])  # the registry's names, before any run folder
    with pytest.raises(ConfigError, match="algo has no field 'tau'"):
        load_preset("tiny", ["algo.name=bsp", "algo.tau=3"])
    with pytest.raises(ConfigError, match="algo has no field 'bmuf_c'"):
        load_preset("tiny", ["algo.name=diloco", "algo.bmuf_c=2"])  # another algorithm's field
    for bad, msg in (("algo.sync_every=0", "algo.sync_every=0 must be >= 1"),
                     ("algo.block_momentum=1.0", "algo.block_momentum=1.0 must be in"),
                     ("algo.outer_momentum=1.5", "algo.outer_momentum=1.5 must be in"),
                     ("algo.easgd_alpha=1.0", "algo.easgd_alpha=1.0 must be in")):
        name = {"sync": "bsp", "block": "bmuf", "outer": "diloco", "easgd": "easgd"}[bad[5:].split("_")[0]]
        with pytest.raises(ConfigError, match=msg):
            load_preset("tiny", [f"algo.name={name}", bad])
    assert [n for n in A.names() if A.periodic(n)] == ["bsp", "bmuf", "diloco", "asgd", "easgd"]


# what this release's config.json holds in its [algo] section: every algorithm's fields
EVERY_FIELD = {"name": "sync", "sync_every": 1, "block_lr": 1.0, "block_momentum": -1.0, "bmuf_c": 1.05,
               "nesterov": True, "outer_lr": 0.7, "outer_momentum": 0.9, "easgd_alpha": 0.1, "round_robin": False}


def test_a_section_of_every_algorithms_fields_reads_as_the_named_ones_config():
    assert A.algo_config(EVERY_FIELD) == cfg(name="sync")
    assert A.algo_config({**EVERY_FIELD, "name": "bmuf", "sync_every": 20, "bmuf_c": 2.0}) == cfg(
        name="bmuf", sync_every=20, bmuf_c=2.0)
    assert A.algo_config({**EVERY_FIELD, "name": "easgd", "easgd_alpha": 0.3, "round_robin": True}) == cfg(
        name="easgd", easgd_alpha=0.3, round_robin=True)
    with pytest.raises(ConfigError, match=r"\[algo\] unknown keys \['outer_lr'\]"):
        A.algo_config({**EVERY_FIELD, "outer_lr": 0.5})  # another algorithm's field, set: refused, not dropped
    with pytest.raises(ConfigError, match=r"\[algo\] unknown keys \['tau'\]"):
        A.algo_config({"name": "bsp", "tau": 3})


def test_switching_algo_name_keeps_the_fields_the_new_algorithm_has(tmp_path):
    preset = tmp_path / "p.toml"
    preset.write_text((PRESETS / "tiny.toml").read_text() + '\n[algo]\nname = "bmuf"\nsync_every = 8\nbmuf_c = 2.0\n')
    conf = load_preset(str(preset), ["algo.name=diloco"])
    assert conf.algo == cfg(name="diloco", sync_every=8)  # bmuf_c is bmuf's: dropped with it


def test_train_refuses_an_unknown_algorithm_before_any_folder(tmp_path):
    from speechperf.train import loop
    from speechperf.train.request import TrainRequest

    with pytest.raises(ConfigError, match="algo.name='gossip' is unknown"):
        loop.train(TrainRequest(preset="tiny", overrides=["algo.name=gossip"], out=tmp_path / "run", data=tmp_path))
    assert not (tmp_path / "run").exists()


def test_single_refuses_several_processes():
    with pytest.raises(ConfigError, match="algo.name=single trains in one process, not 2"):
        A.make_algorithm(cfg(name="single"), world=2)


ALPHA, ASYNC_STEPS = 0.3, 4


def async_worker(rank, port, out):
    """asgd (every step) and easgd (every 2 steps) served round robin, plain SGD workers."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    torch.set_num_threads(1)
    if rank == 1:  # a slow worker: whatever it pulls arrives late (in CI, under load, it did: rank 0 had
        # exchanged already, and rank 1 started from another model)
        call = param_server.call

        def late(method, *args):
            if method == "pull":
                time.sleep(1.0)
            return call(method, *args)

        param_server.call = late
    results = {}
    for name, every in (("asgd", 1), ("easgd", 2)):
        own = {"easgd_alpha": ALPHA} if name == "easgd" else {}
        core = model_fn()
        algo = A.make_algorithm(cfg(name=name, sync_every=every, round_robin=True, **own), WORLD, rank)
        model = algo.wrap(core)
        opt = optimizer("sgd", core)
        for s in range(ASYNC_STEPS):
            step(model, opt, *batch(rank, s))
            algo.after_step(s + 1)
        results[name] = {"eval": flat(algo.before_eval(ASYNC_STEPS)), "staleness": param_server.staleness(),
                         "comm": algo.comm.bytes}
    algo.close()
    torch.save(results, f"{out}/rank{rank}.pt")
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def async_ranks(tmp_path_factory):
    return _spawned(async_worker, tmp_path_factory.mktemp("async"))


def _sgd_from(vec, rank, s):
    m = model_fn()
    torch.nn.utils.vector_to_parameters(vec.clone(), m.parameters())
    step(m, optimizer("sgd", m), *batch(rank, s))
    return flat(m)


def test_asgd_round_robin_equals_serial_pushes(async_ranks):
    w = flat(model_fn())
    local = [w.clone() for _ in range(WORLD)]
    for s in range(ASYNC_STEPS):
        for k in range(WORLD):  # rank 0's push, then rank 1's
            w = w + (_sgd_from(local[k], k, s) - local[k])  # the server applies the pushed update
            local[k] = w.clone()  # and the worker pulls the current model
    assert torch.allclose(async_ranks[0]["asgd"]["eval"], w, atol=1e-12)  # rank 0 evaluates the server's model
    assert async_ranks[0]["asgd"]["staleness"][:2] == [0, 1]  # rank 1's first push was overtaken once
    assert async_ranks[1]["asgd"]["comm"] == ASYNC_STEPS * 2 * w.numel() * 8


def test_easgd_round_robin_equals_serial_elastic_exchanges(async_ranks):
    centre = flat(model_fn())
    local = [centre.clone() for _ in range(WORLD)]
    for s in range(ASYNC_STEPS):
        for k in range(WORLD):
            local[k] = _sgd_from(local[k], k, s)
            if (s + 1) % 2 == 0:
                diff = ALPHA * (local[k] - centre)  # Eq. 9: the sum of centre and worker is kept
                centre, local[k] = centre + diff, local[k] - diff
    assert torch.allclose(async_ranks[0]["easgd"]["eval"], centre, atol=1e-12)
