"""train.system.cuda_graphs (train/graphs.py): the step on batches padded to a grid of shapes trains
what the plain step trains; every planned batch's shape is captured before the clock; the
configurations it cannot run are refused by name. The capture itself runs on CUDA only."""
import json
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from speechperf.config import load_preset
from speechperf.data.batching import Batching
from speechperf.data.loader import load_index
from speechperf.data.plan import plan_epoch
from speechperf.errors import ConfigError
from speechperf.models import build_model
from speechperf.models.contract import unwrap
from speechperf.train.graphs import (EvalGraph, GraphedModel, check_memory, graph_figures, planned_shapes,
                                     static_bytes)
from speechperf.train.step import make_optimizer, train_step
from tests.conftest import TINY_RUN, cli

CPU = torch.device("cpu")


def _batch(frames, label_lens, seed=0):
    g = torch.Generator().manual_seed(seed)
    return SimpleNamespace(feats=torch.randn(len(frames), max(frames), 93, generator=g), feat_lens=torch.tensor(frames),
                           labels=torch.randint(2, 28, (sum(label_lens),), generator=g), label_lens=torch.tensor(label_lens))


def _trained(graphs: bool, batches, device=CPU, precision="fp32"):
    cfg = load_preset("tiny", [f"precision={precision}", "train.optim.name=sgd", "train.optim.lr=0.1"])
    torch.manual_seed(0)
    core = build_model(cfg.model).to(device)
    model = GraphedModel(core, 16, 8, precision, capture=device.type == "cuda") if graphs else core
    opt = make_optimizer(core, cfg.train, device)
    scaler = torch.amp.GradScaler("cuda", enabled=False)
    losses = [float(train_step(model, b, opt, scaler, device, cfg.train).loss) for b in batches]
    return core, model, losses


def _optim(core, cfg, device):
    return make_optimizer(core, cfg.train, device), torch.amp.GradScaler("cuda", enabled=False)


BATCHES = [_batch((40, 30, 23), (5, 3, 2), 0), _batch((61, 17), (6, 2), 1), _batch((40, 30, 23), (4, 4, 1), 2)]


def test_the_padded_step_trains_what_the_plain_step_trains():
    """Three steps of two batch shapes (3 x 40 -> 8 x 48 and 2 x 61 -> 8 x 64 on the grid):
    the same losses, weights and batch-norm statistics, to float32's rounding (sums in another
    order). Plain SGD: the conv's bias, which the batch norm after it removes, has a gradient
    of zero but for rounding, which AdamW would turn into full-sized steps of random sign."""
    plain, _, want = _trained(False, BATCHES)
    core, model, got = _trained(True, BATCHES)
    assert got == pytest.approx(want, rel=1e-5)
    for (name, p), q in zip(plain.state_dict().items(), core.state_dict().values()):
        assert torch.allclose(p.float(), q.float(), atol=1e-4, rtol=0), name  # fp32 sums in another order
    assert unwrap(model) is core and model.shape(3, 40) == (8, 48) and model.shape(8, 48) == (8, 48)
    assert graph_figures(model) == {"shapes": 0, "eval shapes": 0, "capture s": 0.0, "eager steps": 0, "grid": [8, 16]}
    assert model.prepare({(8, 48)}, 93, CPU)["graphs"] == 0 and model.prepared  # nothing to capture on a CPU
    assert graph_figures(core) is None


def test_evaluation_mode_runs_the_plain_model():
    core, model, _ = _trained(True, BATCHES[:1])
    model.eval()
    b = BATCHES[1]
    with torch.no_grad():
        lp, out = model(b.feats, b.feat_lens)
        want, want_out = core(b.feats, b.feat_lens)
    assert torch.equal(lp, want) and torch.equal(out, want_out)


def test_after_prepare_a_new_shape_runs_eagerly_and_is_counted_never_captured(monkeypatch):
    """Captures happen before the clock only (inside it the loader's pin-memory thread could
    invalidate one): a shape met before prepare() is captured when met, one met after it runs
    the same padded pass eagerly and counts in ``eager steps``. The capture is faked (a CPU)."""
    cfg = load_preset("tiny")
    torch.manual_seed(0)
    core = build_model(cfg.model)
    model = GraphedModel(core, 16, 8, capture=True)
    captured = []

    def fake_capture(xp, mask):
        captured.append(tuple(xp.shape[:2]))
        model.graphs[(*xp.shape[:2], xp.dtype)] = core.masked
        return core.masked

    monkeypatch.setattr(model, "_capture", fake_capture)
    model.train()
    first, second = BATCHES[0], BATCHES[1]
    model(first.feats, first.feat_lens)  # 3 x 40 -> 8 x 48, before prepare: captured
    assert captured == [(8, 48)] and model.eager_steps == 0
    model.prepare(set(), 93, CPU)
    model(first.feats, first.feat_lens)  # replayed
    out, _ = model(second.feats, second.feat_lens)  # 2 x 61 -> 8 x 64: not planned, after prepare
    assert captured == [(8, 48)] and model.eager_steps == 1 and len(model.graphs) == 1
    assert out.shape[1] == 2 and graph_figures(model)["eager steps"] == 1


def _valid_close(got, want, lens, tol):
    for i, n in enumerate(lens.tolist()):
        assert torch.allclose(got[:n, i], want[:n, i], atol=tol, rtol=0), i


SAME_SHAPE = _batch((40, 12, 33), (2, 1, 3), 5)  # BATCHES[0]'s 3 x 40, other lengths and values


def test_the_evaluation_pass_on_its_buffers_equals_the_plain_model_at_valid_frames():
    """The evaluation's captured pass, run eagerly on the same static buffers (a CPU): the masked
    pass in evaluation mode (running statistics, no dropout) gives the plain model's log-probs at
    every valid frame, fp32 to its rounding; the buffers take each batch of the shape in turn;
    a shape not prepared runs the plain model."""
    core, model, _ = _trained(True, BATCHES)  # trained: running statistics away from 0 and 1
    model.eval()
    model.prepare_eval({(3, 40)}, 93, CPU)
    assert list(model.eval_graphs) == [(3, 40)] and graph_figures(model)["eval shapes"] == 1
    with torch.no_grad():
        for batch in (BATCHES[0], SAME_SHAPE):
            (got, got_lens), (want, want_lens) = model(batch.feats, batch.feat_lens), core(batch.feats, batch.feat_lens)
            _valid_close(got, want, want_lens, 1e-5)
            assert torch.equal(got_lens, want_lens)
        other = BATCHES[1]  # 2 x 61: not prepared, the plain model
        assert torch.equal(model(other.feats, other.feat_lens)[0], core(other.feats, other.feat_lens)[0])


def test_in_fp64_the_evaluation_pass_equals_the_plain_model_to_1e_12():
    core, _, _ = _trained(True, BATCHES)
    core.double().eval()
    graph = EvalGraph(core, 3, 40, 93, CPU, "fp32", capture=False)
    graph.x = graph.x.double()
    with torch.no_grad():
        for batch in (BATCHES[0], SAME_SHAPE):
            want, lens = core(batch.feats.double(), batch.feat_lens)
            _valid_close(graph(batch.feats.double(), core.output_lengths(batch.feat_lens)), want, lens, 1e-12)


def test_the_graphs_static_bytes_are_the_tensors_a_pass_of_each_shape_makes():
    """Counted independently: the parameters' gradients a backward pass makes, the padded input
    and mask, the output and the gradient it is given, from a real pass of each shape."""
    cfg = load_preset("tiny")
    core = build_model(cfg.model)
    want = 0
    for b, t in [(8, 48), (16, 64)]:
        x = torch.zeros(b, t, 93)
        out = core.masked(x, torch.ones(core.output_lengths(torch.tensor([t]))[0], b, dtype=torch.bool))
        grad_out = torch.ones_like(out)
        out.backward(grad_out)
        nbytes = lambda ts: sum(u.numel() * u.element_size() for u in ts)  # noqa: E731
        want += nbytes(p.grad for p in core.parameters()) + nbytes([x, out, grad_out]) + out.shape[0] * b  # mask: bool
        core.zero_grad(set_to_none=True)
    assert static_bytes(core, {(8, 48), (16, 64)}, 93) == want


def test_graphs_over_half_the_free_memory_are_refused_naming_the_figures():
    model = GraphedModel(build_model(load_preset("tiny").model), 16, 8, capture=False)
    need = static_bytes(model._orig_mod, {(8, 48), (16, 64)}, 93)
    check_memory(model, {(8, 48), (16, 64)}, 93, free=2 * need)  # half the free memory: taken
    with pytest.raises(ConfigError, match=r"plan 2 batch shapes at the grid train.system.graph_frames=16 x train.system.graph_batch="
                                          r"8, whose graphs keep .* GB .*more than 50% of the device's .* GB free"
                                          r"(.|\n)*train.system.graph_frames=64 train.system.graph_batch=32"):
        check_memory(model, {(8, 48), (16, 64)}, 93, free=2 * need - 1)


def test_every_planned_batch_has_its_grid_shape_in_the_set(tiny_features):
    cfg = load_preset("tiny", ["loader.max_duration=30", "loader.mode=bucket"])
    index = load_index(tiny_features, ["train-clean"])
    model = GraphedModel(torch.nn.Identity(), 16, 8, capture=False)
    shapes = planned_shapes(model, index, Batching(cfg.loader, seed=1), epochs=3)
    seen = set()
    for epoch in (1, 2, 3):
        for batch in plan_epoch(index, cfg.loader, epoch, 1).batches:
            b, t = model.shape(len(batch), int(np.max(index.frames[batch])))
            assert b % 8 == 0 and t % 16 == 0 and b >= len(batch)
            seen.add((b, t))
    assert shapes == seen and len(shapes) >= 2


@pytest.mark.parametrize("over, says", [
    (["model.name=conformer"], "needs model ds2"),
    (["train.system.cuda_graphs=true", "train.system.compile=true"], "cannot both be on"),
    (["train.system.graph_frames=0"], "train.system.graph_frames=0"),
])
def test_what_cuda_graphs_cannot_run_is_refused(over, says):
    with pytest.raises(ConfigError, match=says):
        load_preset("tiny", ["train.system.cuda_graphs=true", *over])


def test_a_cpu_run_asking_for_cuda_graphs_exits_2_naming_it(tiny_features, tmp_path):
    p = cli("train", "--data", tiny_features, "--out", tmp_path / "run", "--preset", "tiny", "train.system.cuda_graphs=true")
    assert p.returncode == 2 and "train.system.cuda_graphs=true needs one CUDA device" in p.stderr, p.stderr


@pytest.mark.cuda
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_graphed_steps_train_what_the_eager_padded_steps_train(precision):
    """On CUDA: the captured passes replayed give the eager padded passes' losses and weights
    (both padded: the same shapes), each shape captured once, the batch norms' statistics
    put back after each capture."""
    dev = torch.device("cuda", 0)
    cfg = load_preset("tiny", [f"precision={precision}", "train.optim.name=sgd", "train.optim.lr=0.1"])
    results = []
    for capture in (False, True):
        torch.manual_seed(0)
        core = build_model(cfg.model).to(dev)
        model = GraphedModel(core, 16, 8, precision, capture=capture)
        opt = make_optimizer(core, cfg.train, dev)
        scaler = torch.amp.GradScaler("cuda", enabled=False)
        losses = [float(train_step(model, b, opt, scaler, dev, cfg.train).loss) for b in BATCHES]
        results.append((core, model, losses))
    (ce, _, le), (cg, mg, lg) = results
    assert lg == pytest.approx(le, rel=2e-3 if precision == "bf16" else 1e-5)
    tol = 2e-2 if precision == "bf16" else 1e-4
    for (name, p), q in zip(ce.state_dict().items(), cg.state_dict().values()):
        assert torch.allclose(p.float(), q.float(), atol=tol, rtol=tol), name
    assert len(mg.graphs) == 2 and mg.eager_steps == 0  # captured lazily, but never prepared: no clock yet
    mg.prepare({(8, 80)}, 93, dev)
    assert len(mg.graphs) == 3 and mg.prepared
    train_step(mg, _batch((70, 9), (3, 1)), *_optim(cg, cfg, dev), dev, cfg.train)  # 2 x 70 -> 8 x 80: prepared
    assert mg.eager_steps == 0
    train_step(mg, _batch((90,), (3,)), *_optim(cg, cfg, dev), dev, cfg.train)  # 1 x 90 -> 8 x 96: met in the clock
    assert mg.eager_steps == 1 and len(mg.graphs) == 3  # run eagerly, not captured


@pytest.mark.cuda
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_the_captured_evaluation_pass_gives_the_plain_model_s_outputs(precision):
    """On CUDA: the evaluation's forward pass replayed from its graph gives what the same pass
    gives run eagerly (the same ops: to rounding) and, at every valid frame, the plain model's
    log-probs (other batch-norm arithmetic, which cuDNN's TF32 or bf16 may round apart: loosely);
    a second batch of the same shape replays into the same buffers and leaves the first batch's
    returned output as it was."""
    dev = torch.device("cuda", 0)
    cfg = load_preset("tiny", [f"precision={precision}"])
    torch.manual_seed(0)
    core = build_model(cfg.model).to(dev)
    model = GraphedModel(core, 16, 8, precision).eval()
    model.prepare_eval({(3, 40)}, 93, dev)
    eager = EvalGraph(core, 3, 40, 93, dev, precision, capture=False)
    same_ops = 1e-2 if precision == "bf16" else 1e-5
    with torch.no_grad(), torch.autocast("cuda", torch.bfloat16, enabled=precision == "bf16"):
        got1, _ = model(BATCHES[0].feats.to(dev), BATCHES[0].feat_lens.to(dev))
        kept = got1.clone()
        got2, _ = model(SAME_SHAPE.feats.to(dev), SAME_SHAPE.feat_lens.to(dev))
        for batch, got in ((BATCHES[0], got1), (SAME_SHAPE, got2)):
            x, lens = batch.feats.to(dev), batch.feat_lens.to(dev)
            want, out_lens = core(x, lens)
            again = eager(x, core.output_lengths(lens))
            for i, n in enumerate(out_lens.tolist()):
                assert torch.allclose(got[:n, i].float(), again[:n, i].float(), atol=same_ops, rtol=0), i
                assert torch.allclose(got[:n, i].float(), want[:n, i].float(), atol=5e-2, rtol=1e-2), i
    assert torch.equal(got1, kept)


@pytest.mark.cuda
@pytest.mark.timeout(300)
def test_a_gpu_run_trains_from_cuda_graphs_end_to_end(tiny_features, tmp_path):
    """The real CLI on a GPU: every planned shape captured before the clock, none inside it, and
    the step's floor replayed through the same graphs after training."""
    p = cli("train", "--data", tiny_features, "--out", tmp_path / "run", *TINY_RUN, "train.system.cuda_graphs=true",
            "train.system.device=cuda", "train.system.precision=bf16", "--json", timeout=300)
    assert p.returncode == 0, p.stderr
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    graphs = summary["cuda_graphs"]
    assert graphs["shapes"] >= 2 and graphs["eager steps"] == 0 and graphs["grid"] == [8, 16]
    assert summary["floor"]["note"] is None and summary["floor"]["loop_over_floor"] > 0
