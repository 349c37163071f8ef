"""Training objectives: what a model's output is trained against and how it becomes text.

A workload is a model and its objective. The model's config class names the objective its
output is made for (a class attribute ``objective``, default ``"ctc"``: models that return CTC
log-probabilities; ``"transducer"``: encoder frames that a prediction network and a joint
network score), and
every part of a run that touches the output goes through the objective's four calls, never an
``if transducer``: the training step's loss (``train_loss``), the evaluation's losses and texts
(``eval_submit``, ``eval_loss``), the logged sentences (``texts``), and what warm-up, MFU and
``bench zoo`` differentiate (``probe_loss``). A new objective is one module registering a class
with :func:`register_objective` and its name in ``OBJECTIVES``' built-ins.

Shapes: ``out`` is whatever the model's ``forward`` returns first (CTC: log-probabilities
``(T', B, C)``; transducer: encoder frames ``(B, T', J)``); ``out_lens`` (B,) are CPU output
lengths, planned from the loader's lengths (models/contract.py), so no objective reads a device
value to know them.
"""
from __future__ import annotations

from typing import Protocol

import torch

from speechperf.models.contract import unwrap
from speechperf.registry import Registry

OBJECTIVES = Registry("objective", [f"speechperf.objectives.{m}" for m in ("ctc", "transducer", "aed")])


def register_objective(name: str):
    """Decorator registering an :class:`Objective` class (instantiated once) under ``name``."""
    return OBJECTIVES.register(name, transform=lambda cls: cls())


class Objective(Protocol):
    """What the loop, evaluation, warm-up, MFU and ``bench zoo`` ask of an objective."""

    name: str
    decoders: tuple[str, ...]  # the evaluation decoders it accepts (train.eval.decoder)

    def train_loss(self, model, out, out_lens: torch.Tensor, batch, device: torch.device, tc
                   ) -> tuple[torch.Tensor, int]:
        """(the batch's loss summed over its possible utterances, 0-dim fp32 on ``device``; the
        impossible utterances' count, from CPU lengths)."""

    def texts(self, model, out, out_lens: torch.Tensor, count: int, units) -> list[str]:
        """The first ``count`` utterances' greedy texts (the logged sentences)."""

    def probe_loss(self, model, out, out_lens: torch.Tensor, label_lens: torch.Tensor | None = None) -> torch.Tensor:
        """A scalar that depends on every output the loss would: what warm-up and the FLOP count
        differentiate (labels drawn here, ``label_lens`` (B,) long or a default share of frames)."""


def objective_name(model) -> str:
    """The objective ``model`` (or its DDP/compiled wrapper, or its config) is trained with: its
    config's class attribute ``objective``; ``"ctc"`` where it names none (every model before
    objectives were named, and external models that do not say)."""
    cfg = getattr(unwrap(model), "cfg", None) if isinstance(model, torch.nn.Module) else model
    return getattr(type(cfg), "objective", "ctc")


def objective_of(model) -> Objective:
    """The registered :class:`Objective` of ``model`` (an ``nn.Module`` or a model config)."""
    return OBJECTIVES.lookup(objective_name(model))
