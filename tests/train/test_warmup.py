"""The warm-up before the TTA clock leaves the model and the random streams as they were."""
import dataclasses

import torch

from speechperf.config import load_preset
from speechperf.models import build_model
from speechperf.train.warmup import WARM_FRAMES, warm_model, warm_shape


def test_warm_model_changes_no_weight_buffer_or_rng():
    cfg = load_preset("tiny", ["threads=1"])
    torch.manual_seed(0)
    model = build_model(cfg.model)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    rng = torch.get_rng_state()
    warm_model(model, cfg, torch.device("cpu"))
    assert torch.equal(torch.get_rng_state(), rng)
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)  # batch-norm statistics included
    assert all(p.grad is None for p in model.parameters())


def test_warm_shape_is_the_training_shape_for_padded_gpu_batches():
    cfg = load_preset("paper", [])
    assert warm_shape(cfg, torch.device("cuda")) == (cfg.loader.batch_size, cfg.loader.pad_frames)
    assert warm_shape(cfg, torch.device("cpu")) == (2, WARM_FRAMES)
    bucketed = dataclasses.replace(cfg, loader=dataclasses.replace(cfg.loader, mode="bucket"))
    assert warm_shape(bucketed, torch.device("cuda")) == (2, WARM_FRAMES)
