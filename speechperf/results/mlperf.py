"""MLPerf training-rules compliance of a run's ``events.log``.

speechperf's log is checked by mlperf-logging's own compliance checker against the
training rules of ``RULESET``: its stock ``common.yaml`` (submission keys, cache_clear,
init_start/init_stop before run_start, run_stop with a status, epochs, evaluations,
train_samples, eval_samples) is used as shipped, except that the division's follow-up rule
file (which only knows MLPerf's own benchmarks) is replaced by speechperf's benchmark rules,
``mlperf_rules.yaml`` beside this module. The two rule files are written to a temporary
folder and handed to the checker with ``--config``, as its documentation intends for rules
beyond its own. ``eval_accuracy``'s value is the run's ``train.stop.target_metric``, named in its
metadata (train/recorder.py); the rules accept the target metrics of speechperf/metric.py,
written into them here.
"""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import mlperf_logging.compliance_checker as cc
import yaml

from speechperf import metric
from speechperf.children import sigterm_stops
from speechperf.errors import SpeechperfError
from speechperf.results.events import C, EventLog
from speechperf.results.layout import EVENTS_FILE, events_log

RULESET = "6.0.0"  # the newest training ruleset of the mlperf-logging release pyproject pins
BENCHMARK = "speechperf_ds2"
# speechperf is not one of MLPerf's closed-division benchmarks: its runs are open-division
# entries (the division also sets the checker's initialization limit: 240 min open).
DIVISION = "open"
BENCHMARK_RULES = Path(__file__).with_name("mlperf_rules.yaml")
TARGET_METRICS = "TARGET_METRICS"  # in BENCHMARK_RULES: replaced by the list of speechperf/metric.py's target metrics


def log_submission(events: EventLog, platform: str, org: str | None = None) -> None:
    """The submission keys: organization (``SPEECHPERF_ORG`` or "speechperf"), the platform
    (the run's label or machine), open division, the benchmark, status on premises/cloud."""
    events.event(C.SUBMISSION_ORG, org or os.environ.get("SPEECHPERF_ORG") or "speechperf")
    events.event(C.SUBMISSION_PLATFORM, platform)
    events.event(C.SUBMISSION_DIVISION, DIVISION)
    events.event(C.SUBMISSION_BENCHMARK, BENCHMARK)
    events.event(C.SUBMISSION_STATUS, "research")
    # The page cache is not dropped (that needs root and disturbs other work on the machine):
    # logged as False, so a reader knows the first epoch may have read features from memory.
    events.event(C.CACHE_CLEAR, False)


def rules_config(folder: Path) -> Path:
    """Write the checker config into ``folder`` (a temporary one); returns the file to give
    ``--config``: the stock training common rules of ``RULESET`` whose division rule
    enqueues speechperf's benchmark rules instead of MLPerf's list of benchmarks."""
    stock = Path(cc.__file__).with_name(f"training_{RULESET}") / "common.yaml"
    records = yaml.load(stock.read_text(encoding="utf-8"), Loader=yaml.BaseLoader)
    bench = Path(folder) / "speechperf_benchmark.yaml"
    bench.write_text(benchmark_rules(), encoding="utf-8")
    found = False
    for record in records:
        key = record.get("KEY", {})
        if key.get("NAME") == C.SUBMISSION_DIVISION:
            # stock POST: enqueue '{division}_common.yaml' and set the initialization limit
            key["POST"] = (f" enqueue_config({str(bench)!r}); "
                           "s['compile_time_mins'] = 240 if v['value'] == 'open' else 30 ")
            found = True
    if not found:
        raise RuntimeError(f"{stock} has no submission_division rule: mlperf-logging changed; update {__file__}")
    common = Path(folder) / "speechperf_common.yaml"
    common.write_text(yaml.safe_dump(records, sort_keys=False), encoding="utf-8")
    return common


def benchmark_rules() -> str:
    """speechperf's benchmark rules (``BENCHMARK_RULES``) with the metrics ``eval_accuracy`` may
    be of written in: the target metrics of speechperf/metric.py (any run's train.stop.target_metric)."""
    text = BENCHMARK_RULES.read_text(encoding="utf-8")
    if TARGET_METRICS not in text:
        raise RuntimeError(f"{BENCHMARK_RULES} has no {TARGET_METRICS} to write the target metrics into")
    return text.replace(TARGET_METRICS, repr(list(metric.targets())))


def check_log(path: Path) -> dict:
    """Run mlperf-logging's compliance checker on ``path``; ``{"ok", "output"}``."""
    with sigterm_stops(), tempfile.TemporaryDirectory(prefix="speechperf-mlperf-") as tmp:  # SIGTERM: removed too
        config = rules_config(Path(tmp))
        p = subprocess.run([sys.executable, "-m", "mlperf_logging.compliance_checker", "--usage", "training",
                            "--ruleset", RULESET, "--config", str(config), "--log_output", str(Path(tmp) / "out.log"),
                            str(path)], capture_output=True, text=True, timeout=300)
    return {"ok": p.returncode == 0, "output": (p.stdout + p.stderr).strip()}


# Lines of the checker's output that begin one of its findings (mlp_compliance.put_message).
_FINDINGS = ("Required", "CHECK for", "failed test", "Failed checks", "Could not find", "Log lines had", "No log lines")


def check_run(run: Path) -> dict:
    """``speechperf check-log``: one row for a run folder's (or a log file's) events.log."""
    path = events_log(run)
    if not path.is_file():
        raise SpeechperfError(f"{path} does not exist: give a run folder or its {EVENTS_FILE}")
    result = check_log(path)
    findings = [line for line in result["output"].splitlines() if line.startswith(_FINDINGS)]
    return {"log": str(path), "usage": "training", "ruleset": RULESET, "compliant": result["ok"],
            "findings": len(findings), "first_finding": findings[0] if findings else None}
