"""The CPUs this process may run on: the one count every stage sizes its threads and workers by.

Below every stage: the loader's decompression threads (data/loader.py), the decode pool
(decode/batch.py) and the seeds placed side by side (drive/seed_slots.py) read it.
"""
from __future__ import annotations

import os


def usable_cpus() -> int:
    """CPUs this process may run on (its affinity mask: a container's or taskset's share)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # no affinity call on this platform (macOS)
        return os.cpu_count() or 1
