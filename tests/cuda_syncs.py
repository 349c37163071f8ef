"""Host synchronizations counted by CUDA's sync debug mode, shared by the cuda-marked tests.

torch warns "called a synchronizing CUDA operation" at each one; the first
``set_sync_debug_mode`` of a process also warns that the mode "is a prototype feature and does
not yet detect all synchronizing operations", which is no sync (it failed one test per worker
on an H200 when the tests matched any warning holding "synchroniz")."""
from __future__ import annotations

SYNC_WARNING = "called a synchronizing CUDA operation"  # c10/cuda/CUDAFunctions.cpp, warn_or_error_on_sync


def sync_warnings(caught) -> list[str]:
    """The messages of the recorded warnings that are host synchronizations."""
    return [str(w.message) for w in caught if SYNC_WARNING in str(w.message)]
