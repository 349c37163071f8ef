"""Time-to-accuracy (SPEC D): TTA(a, e), minutes from model creation until the median of
the last e per-epoch evaluations first reaches the target a; None (NA) when never."""
from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Sequence

from speechperf.errors import SpeechperfError
from speechperf.results import ResultsDB, default_db_path


def tta_minutes(evals: Sequence[tuple[float, float]], target: float, epochs: int = 3) -> float | None:
    """``evals``: (TTA clock seconds, error %) per epoch in epoch order -> minutes or None.

    The median is taken over exactly the last ``epochs`` evaluations, so the earliest
    possible TTA is at the ``epochs``-th evaluation: accuracy must be persistent.
    """
    if epochs < 1:
        raise SpeechperfError(f"epochs must be >= 1, got {epochs}")
    for i in range(epochs - 1, len(evals)):
        window = [v for _, v in evals[i - epochs + 1 : i + 1]]
        if statistics.median(window) <= target:
            return evals[i][0] / 60.0
    return None


def read_run_info(run: Path) -> dict:
    """The ``run.json`` a training run writes into its folder (run_id, db path)."""
    path = Path(run) / "run.json"
    if not path.exists():
        raise SpeechperfError(f"{run} is not a run folder (no run.json)")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise SpeechperfError(f"{path}: not valid JSON ({e})") from e


def epoch_evals(db: ResultsDB, run_id: str, metric: str) -> list[tuple[float, float]]:
    """Per-epoch validation (clock_s, metric) of a run, in epoch order."""
    rows = db.query(
        "SELECT e.clock_s, e.wer, e.cer FROM evals e JOIN runs r ON r.run_id = e.run_id "
        "WHERE e.run_id = ? AND e.final = 0 AND e.split = json_extract(r.config_json, '$.train.eval_split') "
        "ORDER BY e.epoch",
        [run_id],
    )
    return [(r["clock_s"], r[metric]) for r in rows]


def tta_table(runs: Sequence[Path], metric: str = "cer", targets: Sequence[float] = (10.0, 8.0, 7.0),
              epochs: int = 3, db_path: Path | None = None, price_per_hour: float | None = None,
              platform_file: Path | None = None) -> list[dict]:
    """Table 4 form: one row per (run, target) with minutes and % of the first run, and the run's
    platform with cost to accuracy and TTA x price (``price_per_hour``/``platform_file``
    override what the run recorded; :func:`speechperf.telemetry.platforms.of_run`)."""
    from speechperf.telemetry.platforms import price_columns, with_price_overrides

    if metric not in ("cer", "wer"):
        raise SpeechperfError(f"metric must be cer or wer, got {metric!r}")
    rows: list[dict] = []
    first: dict[float, float | None] = {}
    for index, run in enumerate(runs):
        info = read_run_info(run)
        with ResultsDB(db_path or info.get("db") or default_db_path(run)) as db:
            evals = epoch_evals(db, info["run_id"], metric)
        env = with_price_overrides(_run_env(run), price_per_hour, platform_file)
        for target in targets:
            minutes = tta_minutes(evals, target, epochs)
            if index == 0:
                first[target] = minutes
            ref = first[target]
            relative = 100.0 * (minutes / ref) if minutes is not None and ref else None  # the reference row: exactly 100
            rows.append({"run": str(run), "metric": metric, "target": target, "epochs": epochs,
                         "minutes": minutes, "relative": relative, **price_columns(env, minutes)})
    return rows


def _run_env(run: Path) -> dict:
    """The environment a run recorded (``env.json``); without one, no hardware is known, so no price."""
    path = Path(run) / "env.json"
    try:
        return json.loads(path.read_text()) if path.exists() else {}
    except json.JSONDecodeError as e:
        raise SpeechperfError(f"{path}: not valid JSON ({e})") from e
