"""The CTC objective: impossible utterances counted from the frames the labels need."""
import math
from types import SimpleNamespace

import pytest
import torch

from speechperf.data.units import ctc_min_frames
from speechperf.objectives import OBJECTIVES, objective_of
from speechperf.models import build_model, model_config

CPU = torch.device("cpu")
TC = SimpleNamespace(system=SimpleNamespace(deterministic=False, ctc_kernel="numba"))  # a TrainConfig's [train.system]


def _batch(labels, lens, repeats_counted: bool):
    labels, lens = torch.tensor(labels), torch.tensor(lens)
    need = ctc_min_frames(labels, lens) if repeats_counted else None
    return SimpleNamespace(labels=labels, label_lens=lens, ctc_frames=need)


def test_a_repeated_piece_needs_a_blank_between():
    """Labels [5, 5] need 3 frames: with 2 output frames the utterance is impossible, zeroed and
    counted; the possible one's loss is its own (log 3 for one label over 2 uniform frames of 3 classes)."""
    ctc = OBJECTIVES.lookup("ctc")
    out = torch.full((2, 2, 6), math.log(1 / 6))  # (T'=2, B=2, C=6) uniform
    out_lens = torch.tensor([2, 2])
    loss, impossible = ctc.train_loss(None, out, out_lens, _batch([1, 5, 5], [1, 2], True), CPU, TC)
    assert impossible == 1
    assert loss.item() == pytest.approx(torch.nn.functional.ctc_loss(
        out[:, :1], torch.tensor([1]), torch.tensor([2]), torch.tensor([1]), reduction="sum").item(), rel=1e-6)
    # without the loader's needs (characters: no repeats) the same batch counts none impossible
    assert ctc.train_loss(None, out, out_lens, _batch([1, 5, 4], [1, 2], False), CPU, TC)[1] == 0


def test_every_built_in_model_names_its_objective():
    for name in ("ds2", "dnn", "cldnn", "conformer"):
        assert objective_of(model_config({"name": name})).name == "ctc", name
    assert objective_of(build_model(model_config({"name": "dnn"}))).name == "ctc"
