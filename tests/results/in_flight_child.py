"""``python -m tests.results.in_flight_child FOLDER MARKER`` (conftest's cli_start forks it from the
suite's server): a run folder whose checkpoint of iteration 3 is written whole, then one of
iteration 6 whose background write stalls half way (tests/train/write_fault_child.py's stall:
the MARKER file says so), while this process goes on as the loop would (``MARKER.saved``: save
returned) until it is killed."""
import functools
import sys
import threading
from pathlib import Path

import torch

from speechperf.results import checkpoint
from speechperf.results.progress import Progress
from speechperf.results.run import Run
from tests.train.write_fault_child import stall

folder, marker = sys.argv[1], sys.argv[2]
run = Run.create(folder, kind="train", config={"preset": "tiny"}, env={"cpu_model": "Test CPU"}, label="probe")
writer = run.checkpoint_writer()
checkpoint.save(run, Progress(iteration=3), {"model": {"w": torch.full((1000,), 3.0)}}, writer)
writer.wait()
writer = run.checkpoint_writer(functools.partial(stall, marker=marker))
checkpoint.save(run, Progress(iteration=6), {"model": {"w": torch.full((1000,), 6.0)}}, writer)
Path(f"{marker}.saved").touch()
threading.Event().wait()
