"""The suite's own set-up: pytest-xdist workers share the cores instead of each taking all."""
import os

import pytest
import torch

from tests.conftest import worker_threads


def test_workers_share_the_cores_at_least_one_thread_each():
    assert worker_threads(16, 14) == 1
    assert worker_threads(16, 8) == 2
    assert worker_threads(16, 1) == 16
    assert worker_threads(2, 4) == 1


def test_this_worker_runs_its_share():
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT") or 0)
    if workers < 1:
        pytest.skip("one process (no pytest-xdist workers): torch keeps its own default")
    # set by tests/conftest.py (its share of the cores) or by the user before the run
    assert torch.get_num_threads() == int(os.environ["OMP_NUM_THREADS"])
