"""tests/cuda_syncs.py: only torch's sync warning counts, not the mode's own prototype notice."""
from types import SimpleNamespace

from tests.cuda_syncs import sync_warnings

PROTOTYPE = ("Synchronization debug mode is a prototype feature and does not yet detect all synchronizing "
             "operations (Triggered internally at /pytorch/torch/csrc/cuda/Module.cpp:1003.)")  # torch 2.11, H200
SYNC = "called a synchronizing CUDA operation (Triggered internally at /pytorch/c10/cuda/CUDAFunctions.cpp:179.)"


def test_the_prototype_notice_is_no_sync_and_a_sync_is_one():
    caught = [SimpleNamespace(message=UserWarning(m)) for m in (PROTOTYPE, SYNC, SYNC)]
    assert sync_warnings(caught) == [SYNC, SYNC]
    assert sync_warnings(caught[:1]) == []
