"""Where a training step's time goes: ``torch.profiler`` CPU time grouped by kind of work.

Every profiled op's own time (self CPU time, children excluded) is given to the kind of
the outermost op above it that has one: an ``aten::linear`` and the ``aten::addmm`` inside
it are matmul/linear; everything under ``aten::lstm`` (or oneDNN's recurrent layer) is
LSTM, under ``scaled_dot_product_attention`` attention, under ``Optimizer.step`` the
optimizer; a backward op is grouped by its autograd node (``ConvolutionBackward0``:
convolution). A convolution whose weight has one input channel per group on a multi-channel
input is depthwise. What no kind claims (element-wise ops, copies, indexing, the loss's
reduction, gradient clipping, the skipped-step guard) is "other".

On a GPU the self time is the host's time to launch, not the device's: this grouping is
for CPU training steps (the device's kernel times need the CUDA activity).
"""
from __future__ import annotations

import re
from typing import Callable

from torch.profiler import ProfilerActivity, profile

KINDS = ("matmul/linear", "LSTM", "convolution", "attention", "depthwise convolution", "normalization", "CTC",
         "optimizer", "other")
_RULES = (  # (kind, pattern on the op or record name), first match wins
    ("optimizer", re.compile(r"^Optimizer\.")),
    ("CTC", re.compile(r"ctc", re.I)),
    ("LSTM", re.compile(r"lstm|rnn|gru", re.I)),
    ("attention", re.compile(r"scaled_dot_product|attention", re.I)),
    ("convolution", re.compile(r"conv", re.I)),
    ("normalization", re.compile(r"(layer|batch|group|instance)_?norm", re.I)),
    ("matmul/linear", re.compile(r"^aten::(linear|mm|addmm|bmm|baddbmm|matmul|_addmm_activation)$|"
                                 r"^(Addmm|Mm|Bmm|Baddbmm)Backward", re.I)),
)
CONV_SHAPES = {"aten::conv1d": (0, 1), "aten::conv2d": (0, 1), "aten::convolution": (0, 1),
               "aten::_convolution": (0, 1), "aten::mkldnn_convolution": (0, 1),
               "aten::convolution_backward": (1, 2)}  # op -> (input, weight) argument positions


def _depthwise(event) -> bool:
    """Whether the convolution at ``event`` (or the first convolution below it that recorded
    its shapes) is depthwise: one input channel per group, more than one channel in all."""
    todo = [event]
    while todo:
        e = todo.pop(0)
        where = CONV_SHAPES.get(e.name)
        shapes = e.input_shapes or []
        if where and len(shapes) > where[1] and len(shapes[where[1]]) >= 3 and len(shapes[where[0]]) >= 3:
            return shapes[where[1]][1] == 1 and shapes[where[0]][1] > 1
        todo.extend(e.cpu_children)
    return False


def kind_of(event) -> str | None:
    """The kind of work ``event`` names by itself (None: it does not say)."""
    name = event.name.removeprefix("autograd::engine::evaluate_function: ")
    for kind, pattern in _RULES:
        if pattern.search(name):
            return "depthwise convolution" if kind == "convolution" and _depthwise(event) else kind
    return None


def group(events) -> dict[str, float]:
    """Self CPU microseconds per kind, over the profiler's ``events``."""
    totals = dict.fromkeys(KINDS, 0.0)
    said: dict[int, str | None] = {}  # kind_of per event, each event asked once

    def says(e):
        if id(e) not in said:
            said[id(e)] = kind_of(e)
        return said[id(e)]

    for e in events:
        path, up = [], e
        while up is not None:
            path.append(up)
            up = up.cpu_parent
        kind = next((k for k in map(says, reversed(path)) if k), "other")  # the outermost that says
        totals[kind] += e.self_cpu_time_total
    return totals


def step_breakdown(step: Callable[[], object], steps: int = 3) -> dict[str, float]:
    """% of the profiled CPU time of ``steps`` calls of ``step`` per kind (sums to 100)."""
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        for _ in range(steps):
            step()
    totals = group(prof.events())
    whole = sum(totals.values()) or 1.0
    return {k: 100.0 * v / whole for k, v in totals.items()}
