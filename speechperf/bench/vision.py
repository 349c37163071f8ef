"""Import torchvision's model definitions, also where its C extension cannot load.

Measured on this project's machines: PyPI's torchvision 0.28.0 (the release paired with
torch 2.13.0) is built against the CUDA build of torch, and its ``_C`` extension does not
load beside the CPU build. torchvision then skips its C operators (``_has_ops()`` is
False) except two fake-tensor registrations, for ``torchvision::nms`` and ``::qnms``, that
it makes unconditionally; they fail with "operator torchvision::nms does not exist" and
abort ``import torchvision``. The classification models (ResNet-50, Inception v3, VGG16)
are plain Python over torch.nn and never call those operators, so declaring the two
schemas through torch.library before a second import attempt is enough. Detection
operators (nms, roi_align) stay unavailable and raise if called.
"""
from __future__ import annotations

import sys

import torch

from speechperf.errors import SpeechperfError

# Kept for the life of the process: a Library object that is garbage-collected removes
# its definitions again.
_SCHEMAS: list = []
MISSING_OP = "torchvision::nms does not exist"


def _forget_partial_import() -> None:
    for name in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
        del sys.modules[name]


def _declare_nms_schemas() -> None:
    lib = torch.library.Library("torchvision", "DEF")
    lib.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    lib.define("qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    _SCHEMAS.append(lib)


def vision_models():
    """The ``torchvision.models`` module, or SpeechperfError saying why it cannot be had."""
    try:
        import torchvision.models as tvm  # the optional zoo extra
        return tvm
    except ImportError as e:
        raise SpeechperfError(f"torchvision not installed ({e}); pip install 'speechperf[zoo]'") from None
    except RuntimeError as e:
        if MISSING_OP not in str(e) or _SCHEMAS:
            raise SpeechperfError(f"torchvision not importable (RuntimeError: {str(e)[:80]})") from None
    _forget_partial_import()
    _declare_nms_schemas()
    try:
        import torchvision.models as tvm  # the optional zoo extra
    except Exception as e:  # a build whose failure is not the one explained above
        raise SpeechperfError(f"torchvision not importable ({type(e).__name__}: {str(e)[:80]})") from None
    return tvm
