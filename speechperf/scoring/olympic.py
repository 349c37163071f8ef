"""MLPerf's score of a benchmark's runs: the olympic mean of mlperf-logging's result summarizer
(the seeds' aggregation, studies/aggregate.py, and the reference check, studies/rcp.py)."""
from __future__ import annotations

from functools import lru_cache

MAX_DROPPED = 1  # MLPerf's result summarizer: non-converged runs tolerated per benchmark (olympic scoring drops them)
MIN_RUNS = 3  # the summarizer's olympic average needs the fastest and the slowest to drop and one to keep


@lru_cache(maxsize=1)
def _olympic():
    """mlperf-logging's result summarizer's olympic average (imported once: it pulls pandas)."""
    from mlperf_logging.result_summarizer.result_summarizer import _compute_olympic_average  # heavy: pulls pandas

    return _compute_olympic_average


def olympic_mean(reached: list[float], failed: int) -> tuple[float | None, str]:
    """MLPerf's score of a benchmark's runs: the result summarizer's olympic average, where
    ``failed`` runs that never converged are the dropped slowest; (None, why) without one."""
    if failed > MAX_DROPPED:
        return None, f"no score: {failed} runs never reached the target (MLPerf tolerates {MAX_DROPPED})"
    if len(reached) + failed < MIN_RUNS:  # what the summarizer answers too (tested), without importing pandas
        return None, f"no score: {len(reached) + failed} runs (olympic scoring needs {MIN_RUNS})"
    score = _olympic()(sorted(reached), failed, MAX_DROPPED)
    if score is None:
        return None, f"no score: {len(reached) + failed} runs (olympic scoring needs {MIN_RUNS})"
    why = "dropped the fastest and the slowest" if not failed else "dropped the fastest; the failed run is the slowest"
    return score, why
