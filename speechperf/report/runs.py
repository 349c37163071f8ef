"""One run as the report sees it: its rows in the results database and its run folder."""
from __future__ import annotations

import json
from pathlib import Path

from speechperf.errors import SpeechperfError
from speechperf.metrics.tta import read_run_info
from speechperf.results import ResultsDB

SENTENCES_SHOWN = 3  # last logged sentence batches per run


def db_of(run: Path, db_path: Path | None) -> Path:
    """The database given, else the one the run recorded in its run.json."""
    return Path(db_path) if db_path else Path(read_run_info(run)["db"])


def load_run(run: Path, db: ResultsDB) -> dict:
    """Everything the report shows about one run (read only; nothing is recomputed)."""
    rid = read_run_info(run)["run_id"]
    row = db.query("SELECT * FROM runs WHERE run_id = ?", [rid])
    if not row:
        raise SpeechperfError(f"{run}: run {rid!r} is not in {db.path} (give the right --db)")
    cfg = json.loads(row[0]["config_json"]) if row[0]["config_json"] else {}
    split = cfg.get("train", {}).get("eval_split", "dev-clean")
    return {
        "run": str(run), "run_id": rid, "label": run.name, "row": row[0], "config": cfg,
        "env": json.loads(row[0]["env_json"]) if row[0]["env_json"] else {},
        "iterations": db.query("SELECT * FROM iterations WHERE run_id = ? ORDER BY iteration", [rid]),
        "evals": db.query("SELECT * FROM evals WHERE run_id = ? AND final = 0 AND split = ? ORDER BY epoch", [rid, split]),
        "finals": db.query("SELECT * FROM evals WHERE run_id = ? AND final = 1 ORDER BY split, decoder, beam", [rid]),
        "samples": db.query("SELECT t, source, metric, value FROM samples WHERE run_id = ? ORDER BY t", [rid]),
        "sweep": db.query("SELECT * FROM beam_sweep WHERE run_id = ? ORDER BY decoder, beam", [rid]) if db.has_table("beam_sweep") else [],
        "sentences": _sentences(run / "sentences.jsonl"),
    }


def _sentences(path: Path) -> list[dict]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines()[-SENTENCES_SHOWN:]:
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:  # a run killed mid-write leaves half a line: skip it, say nothing louder
            continue
    return out
