"""``speechperf report RUN... --out DIR``: one self-contained HTML page comparing runs.

It reads only the results database and the run folders (never trains): figures as PNG
files beside ``index.html``, every table also as CSV. Whatever a run did not measure
(GPU, RAPL energy, beam sweeps) is said in words instead of drawn as empty axes. All text
from runs (transcripts above all) is HTML-escaped.
"""
from __future__ import annotations

import csv
import html
import io
import json
from pathlib import Path

from speechperf.atomic import atomic_write_text
from speechperf.metrics.tta import read_run_info, tta_minutes
from speechperf.report import figures
from speechperf.report.aggregate import price_rows, repeated_rows
from speechperf.results import ResultsDB
from speechperf.tables import _fmt


def load_run(run: Path, db_path: Path | None) -> dict:
    """Everything the report shows about one run."""
    info = read_run_info(run)
    with ResultsDB(db_path or info["db"]) as db:
        rid = info["run_id"]
        row = db.query("SELECT * FROM runs WHERE run_id = ?", [rid])
        its = db.query("SELECT * FROM iterations WHERE run_id = ? ORDER BY iteration", [rid])
        cfg = json.loads(row[0]["config_json"]) if row else {}
        split = cfg.get("train", {}).get("eval_split", "dev-clean")
        evals = db.query("SELECT * FROM evals WHERE run_id = ? AND final = 0 AND split = ? ORDER BY epoch", [rid, split])
        finals = db.query("SELECT * FROM evals WHERE run_id = ? AND final = 1 ORDER BY split", [rid])
        samples = db.query("SELECT t, source, metric, value FROM samples WHERE run_id = ?", [rid])
        has_sweep = db.query("SELECT name FROM sqlite_master WHERE type = 'table' AND name = 'beam_sweep'")
        sweep = db.query("SELECT * FROM beam_sweep WHERE run_id = ? ORDER BY decoder, beam", [rid]) if has_sweep else []
    env = json.loads(row[0]["env_json"]) if row and row[0]["env_json"] else {}
    sentences = []
    if (run / "sentences.jsonl").exists():
        sentences = [json.loads(line) for line in (run / "sentences.jsonl").read_text().splitlines()[-3:]]
    return {"run": str(run), "run_id": rid, "label": run.name, "row": row[0] if row else {}, "config": cfg, "env": env,
            "iterations": its, "evals": evals, "finals": finals, "samples": samples, "sentences": sentences,
            "sweep": sweep}


def tta_rows(runs: list[dict]) -> list[dict]:
    """Table 4/6: TTA per run and target, and relative to the fastest run for that target."""
    rows = []
    for metric, targets in (("cer", figures.CER_TARGETS), ("wer", figures.WER_TARGETS)):
        for target in targets:
            mins = {r["label"]: tta_minutes([(e["clock_s"], e[metric]) for e in r["evals"]], target, 3) for r in runs}
            best = min((m for m in mins.values() if m is not None), default=None)
            for label, m in mins.items():
                rows.append({"run": label, "metric": metric.upper(), "target %": target, "TTA minutes": m,
                             "relative to fastest %": 100 * m / best if m is not None and best else None})
    return rows


def energy_rows(runs: list[dict]) -> list[dict]:
    rows = []
    for r in runs:
        energy = [s for s in r["samples"] if s["metric"] == "energy_j"]
        for source in sorted({s["source"] for s in energy}):
            pts = [s for s in energy if s["source"] == source]
            joules = pts[-1]["value"] - (pts[0]["value"] if source.startswith("gpu") else 0.0)
            rows.append({"run": r["label"], "source": source, "energy J": joules, "kWh": joules / 3.6e6})
    return rows


def build_report(runs: list[Path], out: Path, db_path: Path | None = None) -> Path:
    """Write ``out/index.html`` (+ PNG and CSV files) for ``runs``; returns its path."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    data = [load_run(Path(r), db_path) for r in runs]
    parts = [f"<h1>speechperf report: {len(data)} run(s)</h1>",
             "<p>Time-to-accuracy (TTA) is minutes from model creation until the median validation error of the "
             "last 3 epochs reaches the target; NA when never reached. CER is the standard character error rate "
             "(edits / reference characters).</p>"]
    for title, func, name in (("Loss and accuracy over time (Fig. 7)", figures.loss_and_accuracy, "fig7.png"),
                              ("Utilization (Fig. 8)", figures.utilization_window, "fig8.png"),
                              ("Throughput over time (Fig. 9/10)", figures.throughput, "fig9.png")):
        path, why = func(data, out / name)
        parts.append(f"<h2>{title}</h2>" + (f'<img src="{name}" alt="{html.escape(title)}">' if path
                                            else f"<p class=na>Not shown: {html.escape(why)}.</p>"))
    tables = [
        ("Time to accuracy (Table 4/6)", "tta.csv", tta_rows(data)),
        ("Beam width vs evaluation time and accuracy (Table 3; speechperf beam-sweep)", "beam_sweep.csv",
         [{"run": r["label"], "split": w["split"], "decoder": w["decoder"], "beam": w["beam"], "eval s": w["eval_s"],
           "WER %": w["wer"], "CER %": w["cer"], "utterances": w["n_utts"]} for r in data for w in r["sweep"]]),
        ("Final evaluation (Table 5)", "final.csv",
         [{"run": r["label"], "split": f["split"], "decoder": f["decoder"], "beam": f["beam"], "WER %": f["wer"],
           "CER %": f["cer"], "CER paper %": f["cer_paper"], "utterances": f["n_utts"]} for r in data for f in r["finals"]]),
        ("Runs and machines", "runs.csv",
         [{"run": r["label"], "status": r["row"].get("status"), "preset": r["row"].get("preset"),
           "seed": r["row"].get("seed"), "cpu": r["env"].get("cpu_model"), "cores": r["env"].get("cpu_cores_logical"),
           "gpus": ", ".join(g["name"] for g in r["env"].get("gpus", [])) or "none",
           "torch": r["env"].get("libraries", {}).get("torch")} for r in data]),
        ("Price/performance (Table 1 prices; TTA to CER 10)", "price.csv", price_rows(data)),
        ("Repeated runs (seeds), MLPerf aggregation", "repeated.csv", repeated_rows(data)),
        ("Energy (counters)", "energy.csv", energy_rows(data)),
    ]
    for title, name, rows in tables:
        parts.append(f"<h2>{title}</h2>")
        if rows:
            _write_csv(out / name, rows)
            parts.append(_html_table(rows) + f'<p><a href="{name}">{name}</a></p>')
        else:
            what = {"energy.csv": "no energy counter (RAPL or NVML) was readable in these runs",
                    "repeated.csv": "no configuration was run with more than one seed",
                    "beam_sweep.csv": "no beam sweep was run (speechperf beam-sweep RUN)"}.get(name, "no rows")
            parts.append(f"<p class=na>Not measured: {what}.</p>")
    parts += _db_sections(db_path or read_run_info(Path(runs[0]))["db"], out)
    parts.append("<h2>Sentences generated during training (greedy, last three)</h2>")
    pairs = [(r["label"], s["iteration"], p) for r in data for s in r["sentences"] for p in s["pairs"][:1]]
    parts.append(_html_table([{"run": lab, "iteration": it, "reference": p["ref"], "hypothesis": p["hyp"]}
                              for lab, it, p in pairs]) if pairs else "<p class=na>No sentences logged.</p>")
    page = ("<!doctype html><html><head><meta charset=utf-8><title>speechperf report</title><style>"
            "body{font-family:sans-serif;margin:2em;max-width:1300px}table{border-collapse:collapse;margin:1em 0}"
            "td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}img{max-width:100%}.na{color:#a60}"
            "</style></head><body>" + "\n".join(parts) + "</body></html>")
    atomic_write_text(out / "index.html", page)
    return out / "index.html"


def _db_sections(db_path, out: Path) -> list[str]:
    """Bench and parallel tables of the same results database (sections registry)."""
    from speechperf.report.sections import SECTIONS

    parts = []
    with ResultsDB(db_path) as db:
        for name, section in SECTIONS.items():
            title, rows, why = section(db)
            parts.append(f"<h2>{html.escape(title)}</h2>")
            if rows:
                _write_csv(out / f"{name}.csv", rows)
                parts.append(_html_table(rows) + f'<p><a href="{name}.csv">{name}.csv</a></p>')
            else:
                parts.append(f"<p class=na>Not shown: {html.escape(why)}.</p>")
    return parts


def _html_table(rows: list[dict]) -> str:
    cols = list(rows[0])
    head = "".join(f"<th>{html.escape(c)}</th>" for c in cols)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(_fmt(r.get(c)))}</td>" for c in cols) + "</tr>" for r in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _write_csv(path: Path, rows: list[dict]) -> None:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=list(rows[0]))
    w.writeheader()
    w.writerows(rows)
    atomic_write_text(path, buf.getvalue())
