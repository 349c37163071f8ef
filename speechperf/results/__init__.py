"""The SQLite results database every command writes and ``tta``/``report`` read."""
from speechperf.results.db import ResultsDB, default_db_path

__all__ = ["ResultsDB", "default_db_path"]
