"""The CTC Conformer stays what it was before its encoder was shared with the transducer
(speechperf/models/rnnt.py): the same parameter names in the same order (checkpoints'
state_dict keys), the same initial values (the same RNG draws at init: a run's reference
curve depends on them), the same outputs in eval and in training mode (dropout's draws).

The fixture was computed by :func:`measure` with the Conformer's code before the change
(``python -m tests.models.test_conformer_unchanged`` writes it again; only do that for a
change meant to alter the model). Initial values are compared bit for bit (torch's CPU
generator is the same on every CPU); outputs within 1e-5, since another CPU's kernels
(AVX-512 against AVX2) may round differently."""
import hashlib
import json
from pathlib import Path

import torch

from speechperf.models import build_model
from speechperf.models.conformer import ConformerConfig

FIXTURE = Path(__file__).parent / "fixtures" / "conformer_ctc.json"
CFG = dict(d_model=16, layers=2, heads=2, conv_kernel=5, subsampling=4, subsampling_channels=4, dropout=0.1,
           attention_dropout=0.1)


def measure() -> dict:
    """Names, an init checksum and outputs of a seeded tiny CTC Conformer."""
    torch.manual_seed(1234)
    model = build_model(ConformerConfig(**CFG))
    digest = hashlib.sha256()
    for name, t in model.state_dict().items():
        digest.update(name.encode() + t.detach().contiguous().numpy().tobytes())
    gen = torch.Generator().manual_seed(5)
    x, lens = torch.randn(2, 23, 93, generator=gen), torch.tensor([23, 14])
    with torch.no_grad():
        evaluated = model.eval()(x, lens)[0]
        torch.manual_seed(7)
        trained = model.train()(x, lens)[0]
    return {"names": [[n, list(t.shape)] for n, t in model.state_dict().items()], "init_sha256": digest.hexdigest(),
            "eval": evaluated.flatten().tolist(), "train": trained.flatten().tolist()}


def test_the_ctc_conformer_is_unchanged():
    want, got = json.loads(FIXTURE.read_text()), measure()
    assert got["names"] == want["names"]
    assert got["init_sha256"] == want["init_sha256"]
    for mode in ("eval", "train"):
        assert torch.allclose(torch.tensor(got[mode]), torch.tensor(want[mode]), atol=1e-5, rtol=0), mode


if __name__ == "__main__":
    FIXTURE.write_text(json.dumps(measure()) + "\n")
