"""The peak memory of a real CPU training step beside the estimate for it: the shared measurement of
tests/hardware/test_memory.py (the CTC FastConformer) and test_memory_heads.py (its transducer and
attention-decoder heads)."""
import dataclasses
from typing import Callable

import torch

from speechperf.config import load_preset
from speechperf.data.loader import Batch
from speechperf.hardware import memory
from speechperf.models import build_model
from speechperf.train.step import make_optimizer, train_step


def measured(cfg, utterances: int, frames: int,
             labels_of: Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]) -> tuple[int, memory.MemoryEstimate]:
    """The peak of a training step (optimizer state and previous gradients alive) and the
    estimate; ``labels_of(output lengths)`` gives the batch's labels (concatenated) and their lengths."""
    train = load_preset("fastconformer-l").train
    tc = dataclasses.replace(train, system=dataclasses.replace(train.system, precision="fp32"))
    torch.manual_seed(0)
    model = build_model(cfg).train()
    opt = make_optimizer(model, tc, torch.device("cpu"))
    lens = torch.linspace(frames, frames * 0.8, utterances).long()
    labels, label_lens = labels_of(model.output_lengths(lens))
    batch = Batch(torch.randn(utterances, frames, 93), lens, labels, label_lens, [""] * utterances,
                  [""] * utterances, 1.0)
    scaler = torch.amp.GradScaler("cpu", enabled=False)
    train_step(model, batch, opt, scaler, torch.device("cpu"), tc)
    state = [v for s in opt.state.values() for v in s.values() if torch.is_tensor(v)]
    live = memory.tensor_bytes([*model.parameters(), *(p.grad for p in model.parameters()), *state, batch.feats])
    step = lambda: train_step(model, batch, opt, scaler, torch.device("cpu"), tc)  # noqa: E731
    # the gradients it frees, allocated in view: copied under the profiler (the lighter way), or a step
    peak = live + memory.allocated_peak(step, before=lambda: memory.fresh_gradients(model.parameters()))
    other = live + memory.allocated_peak(step, before=step)
    assert abs(peak - other) <= 0.01 * peak, ("two ways to the same peak differ", peak, other)
    setup = memory.Setup(tc.optim.name, tc.optim.impl, "fp32", "cpu", checkpointing=cfg.activation_checkpointing)
    return peak, memory.estimate(cfg, memory.Batch(utterances, frames, int(label_lens.max())), setup)
