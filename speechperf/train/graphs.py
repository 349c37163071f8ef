"""The training step's forward and backward passes as CUDA graphs (``train.system.cuda_graphs``).

Why: the `gpu` preset's step is set by the host's kernel launches, not by the GPU. cuDNN's
LSTM launches its kernels per time step per layer: 6,304 launches a step, ~38 ms of kernels
in a 77 ms step on an H200 whose host launches one per 12 us, so the GPU is busy under half of
the training phases (ledger: bench_step_profile, gpu_check; docs/gpu.md). A CUDA graph replays a
captured pass's kernels with one launch from the host.

How: a graph replays fixed shapes, and the loader's length-bucketed batches vary in
utterances and frames. So each training batch is padded up to a grid (frames to a multiple
of ``train.system.graph_frames``, utterances to a multiple of ``train.system.graph_batch``; a padding row
has no valid frame), and the model's :meth:`masked` forward pass, which takes the valid
frames as a mask of the padded shape and reads nothing on the host, is captured once per
grid shape with its backward pass (``torch.cuda.make_graphed_callables``; one memory pool
for every shape: they replay one at a time, each step's outputs consumed before the next).
Every shape the run's epochs plan is captured before the clock starts (:func:`planned_shapes`,
:meth:`GraphedModel.prepare`), while no loader runs; a shape met later runs the same padded
passes eagerly and is counted (``eager_steps``), never captured inside the clock: there the
loader's pin-memory thread allocates page-locked memory and queries events, and in the default
(global) capture mode any thread's such call invalidates a capture (torch 2.11's
``make_graphed_callables`` takes no other mode). CTC, clipping and the optimizer step stay
outside the graphs, as in the plain step (CUDA's CTC reads its lengths on the host).

The padded function is the plain one: padding frames come after an utterance's valid ones
and the LSTMs are unidirectional, the batch norms reduce over the mask, and the loss reads
the valid rows and frames only (tested against the unpadded model on a CPU, where the same
padded pass runs without capture).

The per-epoch evaluation is launch-bound the same way (0.62 s of forward passes for the demo's
4 evaluation batches on an H200). Its batches are kept on the device from the run's start and
are the same every epoch, so each of their shapes is captured once too, forward only, in
evaluation mode (:class:`EvalGraph`: no padding, the batch norms' running statistics, read
where training updates them); any other shape (a final-evaluation split) runs the plain model.
"""
from __future__ import annotations

import time

import torch
import torch.nn as nn
import torch.nn.functional as F

from speechperf.data.index import Index
from speechperf.data.batching import Batching
from speechperf.data.plan import batch_frames
from speechperf.errors import ConfigError

MEMORY_SHARE = 0.5  # of the device's free memory at most for the graphs' static buffers: the rest holds the
# optimizer's state, the shared pool's activations and the evaluation batches kept on the device (<= 25%)
WARMUP_FIRST = 3  # warm-up passes before the first capture (cuDNN and cuBLAS set up; torch's advice)
WARMUP_NEXT = 2  # before each later capture: the new shape's kernels chosen, workspaces sized


def round_up(n: int, grid: int) -> int:
    return -(-n // grid) * grid


def output_frames(core: nn.Module, frames: int) -> int:
    """The model's output frames for a batch of ``frames`` input frames (a captured shape's)."""
    return int(core.output_lengths(torch.tensor([frames]))[0])


class _Masked(nn.Module):
    """One grid shape's capture: ``core.masked`` as a module (the graphed callable replaces
    this instance's forward; the model's parameters are its own)."""

    def __init__(self, core: nn.Module):
        super().__init__()
        self.core = core

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.core.masked(x, mask)


class EvalGraph:
    """One evaluation batch shape's forward pass (``core.masked`` in evaluation mode, no
    gradients), captured on static input buffers; :meth:`__call__` copies a batch in, replays
    and returns a copy of the output (two batches of one shape replay into the same buffer).
    ``capture=False`` runs the same pass on the same buffers eagerly (a CPU's check)."""

    def __init__(self, core: nn.Module, batch: int, frames: int, features: int, device: torch.device,
                 precision: str, pool=None, capture: bool = True):
        self.core, self.precision = core, precision
        self.x = torch.zeros(batch, frames, features, device=device)  # (B, T, F)
        out_frames = output_frames(core, frames)
        self.frames = torch.arange(out_frames, device=device)[:, None]  # (T', 1)
        self.mask = torch.ones(out_frames, batch, dtype=torch.bool, device=device)  # (T', B)
        self.graph = self.out = None
        if capture:
            self._capture(pool)

    def _pass(self) -> torch.Tensor:
        with torch.no_grad(), _uncached_autocast(self.precision):
            return self.core.masked(self.x, self.mask)  # (T', B, C)

    def _capture(self, pool) -> None:
        was_training = self.core.training
        self.core.eval()
        try:
            side = torch.cuda.Stream()  # torch's recipe: warm-up passes on a side stream, then capture
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(WARMUP_NEXT):
                    self._pass()
            torch.cuda.current_stream().wait_stream(side)
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph, pool=pool):
                self.out = self._pass()
        finally:
            self.core.train(was_training)

    def __call__(self, x: torch.Tensor, out_lens: torch.Tensor) -> torch.Tensor:
        """x: (B, T, F) on the device, out_lens: (B,) output frames -> log-probs (T', B, C)."""
        self.x.copy_(x)
        torch.lt(self.frames, out_lens.to(self.x.device)[None, :], out=self.mask)  # (T', B): valid frames
        if self.graph is None:
            return self._pass()
        self.graph.replay()
        return self.out.clone()


class GraphedModel(nn.Module):
    """The model the step trains, its training passes padded to a grid of shapes and replayed
    from CUDA graphs, its evaluation passes on the kept evaluation batches' shapes too; other
    evaluation passes run the plain model. ``capture=False`` runs the same passes eagerly (the
    CPU's check of the padding and the buffers)."""

    def __init__(self, core: nn.Module, frames_grid: int, batch_grid: int, precision: str = "fp32",
                 capture: bool = True):
        super().__init__()
        self._orig_mod = core  # where contract.unwrap and the algorithms find the model, as under torch.compile
        self.frames_grid, self.batch_grid, self.capture = frames_grid, batch_grid, capture
        self.precision = precision  # the step's autocast, which every capture runs under (without its cache)
        self.graphs: dict[tuple, nn.Module] = {}  # (utterances, frames, dtype) -> the graphed _Masked
        self.eval_graphs: dict[tuple, EvalGraph] = {}  # (utterances, frames) of a kept evaluation batch
        self.pool = None  # the graphs' shared memory pool
        self.prepared = False  # prepare() ran: the clock may be running, no capture after it
        self.eager_steps = 0  # steps of a shape not captured before the clock, run eagerly (with capture only)
        self.capture_s = 0.0  # seconds of every capture so far

    def shape(self, batch: int, frames: int) -> tuple[int, int]:
        """The grid shape a (utterances, frames) batch is padded to."""
        return round_up(batch, self.batch_grid), round_up(frames, self.frames_grid)

    def forward(self, x: torch.Tensor, lengths: torch.Tensor, **planned) -> tuple[torch.Tensor, torch.Tensor]:
        """x: (B, T, F), lengths: (B,) on x's device -> log-probs (T'', B, C) with T'' >= T'
        (the grid's frames), output lengths (B,). ``planned`` (the plain pass's index) is not used."""
        core = self._orig_mod
        if not self.training:
            replay = self.eval_graphs.get(tuple(x.shape[:2])) if x.dtype == torch.float32 else None
            if replay is None:
                return core(x, lengths, **planned)
            out_lens = core.output_lengths(lengths)  # (B,) on lengths' device, no host read
            return replay(x, out_lens), out_lens
        b, t = x.shape[:2]
        bp, tp = self.shape(b, t)
        xp = F.pad(x, (0, 0, 0, tp - t, 0, bp - b))  # (B, T, F) -> (B', T', F): zeros after
        out_lens = core.output_lengths(lengths)  # (B,) on lengths' device, no host read
        frames = output_frames(core, tp)
        valid = F.pad(out_lens, (0, bp - b))  # (B',): a padding row has no valid frame
        mask = torch.arange(frames, device=x.device)[:, None] < valid.to(x.device)[None, :]  # (T'', B')
        return self._run(xp, mask)[:, :b], out_lens

    def _run(self, xp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        graphed = self.graphs.get((*xp.shape[:2], xp.dtype))
        if graphed is None and self.capture and not self.prepared:  # no clock yet: captured when met
            graphed = self._capture(xp, mask)
        if graphed is None:  # a CPU, or a shape met after prepare(): the same padded passes, eagerly
            self.eager_steps += self.capture
            return self._orig_mod.masked(xp, mask)
        return graphed(xp, mask)

    def prepare(self, shapes: set[tuple[int, int]], features: int, device: torch.device) -> dict:
        """Capture every (utterances, frames) grid shape in ``shapes`` now (before the clock);
        returns the initialization parts: the shapes and the seconds."""
        t0 = time.perf_counter()
        for b, t in sorted(shapes) if self.capture else ():  # without capture (a CPU) the padded passes run eagerly
            if (b, t, torch.float32) not in self.graphs:
                x = torch.zeros(b, t, features, device=device)
                self._capture(x, torch.ones(output_frames(self._orig_mod, t), b, dtype=torch.bool, device=device))
        self.prepared = True
        return {"graphs": len(self.graphs), "graphs_s": time.perf_counter() - t0}

    def prepare_eval(self, shapes: set[tuple[int, int]], features: int, device: torch.device) -> dict:
        """Capture the forward pass of every (utterances, frames) shape of the kept evaluation
        batches now (before the clock); returns the initialization parts."""
        t0 = time.perf_counter()
        pool = self._pool() if self.capture else None
        for b, t in sorted(shapes):
            self.eval_graphs[(b, t)] = EvalGraph(self._orig_mod, b, t, features, device, self.precision, pool,
                                                 self.capture)
        seconds = time.perf_counter() - t0
        self.capture_s += seconds
        return {"eval_graphs": len(self.eval_graphs), "eval_graphs_s": seconds}

    def _pool(self):
        """The memory pool every graph of this model shares (made on first use)."""
        if self.pool is None:
            self.pool = torch.cuda.graph_pool_handle()
        return self.pool

    def _capture(self, xp: torch.Tensor, mask: torch.Tensor) -> nn.Module:
        """One shape's forward and backward captured; the model's buffers (batch-norm
        statistics), which the warm-up and capture passes move, put back."""
        t0 = time.perf_counter()
        core = self._orig_mod
        saved = [b.detach().clone() for b in core.buffers()]
        step = _Masked(core).train()
        warmup = WARMUP_NEXT if self.graphs else WARMUP_FIRST
        with _uncached_autocast(self.precision):
            graphed = torch.cuda.make_graphed_callables(step, (xp.detach().clone(), mask.clone()),
                                                        num_warmup_iters=warmup, pool=self._pool())
        with torch.no_grad():
            for b, s in zip(core.buffers(), saved):
                b.copy_(s)
        for p in core.parameters():  # the warm-up passes take gradients with autograd.grad; be sure
            p.grad = None
        self.graphs[(*xp.shape[:2], xp.dtype)] = graphed
        self.capture_s += time.perf_counter() - t0
        return graphed


def _uncached_autocast(precision: str):
    """The step's autocast (models/contract.py's: none for fp32) with its weight cache off: a
    graph cannot keep a cast made outside it (make_graphed_callables refuses the cache). The
    same whoever asks for the capture: the step, or initialization outside any autocast."""
    dtype = torch.bfloat16 if precision == "bf16" else torch.float16
    return torch.autocast("cuda", dtype=dtype, enabled=precision != "fp32", cache_enabled=False)


def planned_shapes(model: GraphedModel, index: Index, batching: Batching, epochs: int) -> set[tuple[int, int]]:
    """The grid shapes of every training batch the run's ``epochs`` epochs plan (rank 0):
    each batch's utterances and its longest utterance's frames, padded to the grid."""
    shapes = set()
    for epoch in range(1, epochs + 1):
        for batch in batching.plan(index, epoch).batches:
            shapes.add(model.shape(len(batch), batch_frames(index.frames[batch], batching.loader)))
    return shapes


def static_bytes(core: nn.Module, shapes: set[tuple[int, int]], features: int) -> int:
    """What the graphs of ``shapes`` keep for the run's life: per shape one gradient per parameter
    (each backward graph owns its own), the padded input (B, T, F) float32, the mask (T'', B)
    bool, the output and its gradient (T'', B, C) float32 (log-softmax runs in float32 under
    autocast). Not counted: the shared pool's activations, one pass's at a time."""
    grads = sum(p.numel() * p.element_size() for p in core.parameters())
    classes = core.fc.out_features
    total = 0
    for b, t in shapes:
        t_out = output_frames(core, t)
        total += grads + b * t * features * 4 + t_out * b * (1 + 2 * classes * 4)
    return total


def check_memory(model: GraphedModel, shapes: set[tuple[int, int]], features: int, free: int) -> None:
    """Refuse, before the run exists, graphs whose static buffers would take more than
    MEMORY_SHARE of the device's ``free`` bytes: captured one by one they would run it out of
    memory minutes into initialization. The message names the figures and the coarser grid."""
    need = static_bytes(model._orig_mod, shapes, features)
    if need > MEMORY_SHARE * free:
        raise ConfigError(
            f"train.system.cuda_graphs: the run's epochs plan {len(shapes)} batch shapes at the grid "
            f"train.system.graph_frames={model.frames_grid} x train.system.graph_batch={model.batch_grid}, whose "
            f"graphs keep {need / 1e9:.1f} GB "
            f"(a gradient per parameter, input and output per shape): more than {MEMORY_SHARE:.0%} of the device's "
            f"{free / 1e9:.1f} GB free. A coarser grid keeps fewer shapes (e.g. train.system.graph_frames="
            f"{model.frames_grid * 4} train.system.graph_batch={model.batch_grid * 4}; benchmarks/run.py graph_shapes "
            "projects shapes, memory and padding per grid), or train without train.system.cuda_graphs")


def graph_figures(local: nn.Module) -> dict | None:
    """The summary's ``cuda_graphs``: training and evaluation shapes captured and their seconds
    (all before the clock), steps of a shape met later and run eagerly; None for a model trained
    without graphs."""
    if not isinstance(local, GraphedModel):
        return None
    return {"shapes": len(local.graphs), "eval shapes": len(local.eval_graphs), "capture s": round(local.capture_s, 3),
            "eager steps": local.eager_steps, "grid": [local.batch_grid, local.frames_grid]}


def graphed(core: nn.Module, tc, device: torch.device) -> GraphedModel:
    """``core`` trained from CUDA graphs (``train.system.cuda_graphs``); the run's configuration
    was checked before (:func:`speechperf.config.run.RunConfig.problems`)."""
    system = tc.system
    return GraphedModel(core, system.graph_frames, system.graph_batch, system.precision, capture=device.type == "cuda")
