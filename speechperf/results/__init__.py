"""The results of runs: the SQLite results database (one schema module) and the run folder."""
from speechperf.results.db import ResultsDB, ResultsError

__all__ = ["ResultsDB", "ResultsError", "Run"]


def __getattr__(name):  # Run imports torch (checkpoints): loaded on first use, not with the database
    if name == "Run":
        from speechperf.results.run import Run

        return Run
    raise AttributeError(name)
