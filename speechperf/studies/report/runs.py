"""One run as the report sees it: its rows in its own results database and its run folder."""
from __future__ import annotations

from speechperf.results.view import RunView
from speechperf.results.workload import workload_label

SENTENCES_SHOWN = 3  # last logged sentence batches per run


def load_run(run: RunView, label: str | None = None) -> dict:
    """Everything the report shows about one open run (read only; nothing is recomputed)."""
    row = run.rows.row()  # a run missing from its database is an error, not an empty report
    # the folder's files: they travel with it (the row's copies are for a shared database)
    cfg, env = run.config, run.env
    work = run.workload  # as run.json recorded it: nothing a folder names is imported
    return {
        "run": str(run.folder), "run_id": run.run_id, "label": label or run.label, "row": row, "config": cfg,
        "env": env, "workload": work, "workload_label": workload_label(work),
        "summary": run.summary() or {},  # {}: unfinished; an unreadable summary.json is refused by name
        "iterations": run.rows.iterations(), "evals": run.rows.evals(), "finals": run.rows.evals(final=True),
        "samples": run.rows.samples(), "sweep": run.rows.beam_sweep(), "sentences": run.log.sentences(SENTENCES_SHOWN),
    }


def legend(r: dict) -> str:
    """A run's name in figures: its label and its workload (model, parameter count)."""
    return f"{r['label']} ({r['workload_label']})" if r.get("workload_label") else r["label"]


def who(r: dict) -> dict:
    """A table row's first columns: the run's label and its workload."""
    return {"run": r["label"], "workload": r.get("workload_label")}
