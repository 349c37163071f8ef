"""The results of runs: the SQLite results database (one schema module) and the run folder
(written: :class:`Run`; read by analyses: :class:`RunView`)."""
from speechperf.results.db import ResultsDB, ResultsError

__all__ = ["ResultsDB", "ResultsError", "Run", "RunView"]


def __getattr__(name):  # the run folder's modules load on first use, not with the database
    if name == "Run":
        from speechperf.results.run import Run  # with numpy and the features' modules: not the database's

        return Run
    if name == "RunView":
        from speechperf.results.view import RunView  # as Run

        return RunView
    raise AttributeError(name)
