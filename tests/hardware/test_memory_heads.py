"""The memory estimate's rules for the transducer's joint and the attention decoder (the FastConformer
encoder under the three heads), against the peak a CPU step measures (torch.profiler's allocator events)."""
import pytest
import torch

from speechperf.config import load_preset
from speechperf.models import describe, model_config
from speechperf.hardware import memory
from tests.hardware import step_peak

TRANSDUCER = {"name": "transducer", "encoder": "fastconformer", "subsampling": 8, "d_model": 64, "layers": 2,
              "heads": 4, "subsampling_channels": 16, "pred_dim": 64, "pred_layers": 2, "joint_dim": 64,
              "num_classes": 129}
AED = {"name": "aed", "d_model": 64, "layers": 1, "heads": 4, "subsampling_channels": 16, "dec_layers": 3,
       "dec_heads": 4, "num_classes": 257}


def _measured(cfg, utterances: int, frames: int, labels_per_frame: float) -> tuple[int, memory.MemoryEstimate]:
    """The peak of a training step and its estimate, ``labels_per_frame`` labels per output frame."""
    def labels_of(out_lens):
        label_lens = (out_lens * labels_per_frame).long().clamp(min=1)
        return torch.randint(1, cfg.num_classes, (int(label_lens.sum()),)), label_lens
    return step_peak.measured(cfg, utterances, frames, labels_of)


@pytest.mark.parametrize("values", [TRANSDUCER, AED], ids=["transducer", "aed"])
@pytest.mark.parametrize("labels_per_frame", [0.5, 2.0])  # the head's share grows with the labels
def test_the_estimate_is_within_15_percent_of_the_measured_peak(values, labels_per_frame):
    cfg = model_config(values)
    peak, est = _measured(cfg, utterances=2, frames=240, labels_per_frame=labels_per_frame)
    assert abs(est.peak() - peak) / peak < 0.15, (est.parts(), peak / memory.GB)
    assert (est.joint > 0) == (cfg.name == "transducer")
    assert est.parameter_count == describe(cfg)["params"]


def test_the_at_scale_heads_have_rules_and_the_joint_grows_with_frames_times_labels():
    rnnt, aed = load_preset("parakeet-rnnt-sizes").model, load_preset("canary-aed-sizes").model
    assert memory.has_rule(rnnt) and memory.has_rule(aed) and not memory.has_rule(load_preset("transducer").model)
    setup = memory.Setup(precision="bf16", device_type="cuda")
    short, long = (memory.estimate(rnnt, memory.Batch(8, 1600, u), setup) for u in (50, 100))
    assert long.joint - short.joint == pytest.approx(short.joint * 50 / 51, rel=1e-6)  # (B, T', U+1, .): linear in U+1
    dec = memory.estimate(aed, memory.Batch(8, 1600, 100), setup)
    assert dec.joint == 0 and dec.parameter_count == describe(aed)["params"]
    with pytest.raises(memory.DoesNotFit, match="what would fit: 2 ranks sharded"):  # the refusal names ways out
        memory.check_fits(short, int(short.peak() * 0.9))
