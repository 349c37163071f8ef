"""The report from a recorded run: files, honest gaps, escaping, and a real browser."""
import json
import re
import shutil
import subprocess

import pytest

from speechperf.report.html import build_report
from speechperf.train.loop import train

HOSTILE = "<b>bold</b> <script>alert(1)</script>"


@pytest.fixture(scope="module")
def recorded_run(tiny_features, tmp_path_factory):
    run = tmp_path_factory.mktemp("runs") / "run"
    train(preset="tiny", data=tiny_features, out=run, overrides=["max_epochs=2", "threads=1"], quiet=True)
    with open(run / "sentences.jsonl", "a") as f:
        f.write(json.dumps({"iteration": 999, "epoch": 2, "loss": 1.0, "pairs": [{"ref": HOSTILE, "hyp": "x"}]}) + "\n")
    return run


def test_report_files_and_gaps(recorded_run, tmp_path):
    index = build_report([recorded_run, recorded_run], tmp_path / "rep")
    page = index.read_text()
    for name in ("fig7.png", "fig8.png", "fig9.png", "tta.csv", "final.csv", "runs.csv"):
        assert (tmp_path / "rep" / name).stat().st_size > 0, name
    assert "Time to accuracy" in page and "Final evaluation" in page
    assert "(no GPU in this run)" not in page or "utilization" in page
    assert HOSTILE not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    if not list((tmp_path / "rep").glob("energy.csv")):
        assert "Not measured: no energy counter" in page


CHECK = """<script>window.addEventListener('load', () => {
  const imgs = [...document.images].map(i => i.complete && i.naturalWidth > 0);
  const tables = [...document.querySelectorAll('table')].map(t => t.rows.length);
  const cells = [...document.querySelectorAll('td')].map(td => td.textContent);
  document.body.setAttribute('data-check', JSON.stringify({imgs, tables, hostile: cells.includes(%s),
    injected: document.querySelectorAll('td b, td script').length}));
});</script>"""


@pytest.mark.skipif(shutil.which("chromium") is None, reason="Debian chromium not installed (scripts/test.sh installs it)")
def test_report_in_headless_chromium(recorded_run, tmp_path):
    out = tmp_path / "rep"
    index = build_report([recorded_run], out)
    probe = out / "probe.html"  # the report plus a checking script; the report itself is untouched
    probe.write_text(index.read_text().replace("</body>", CHECK % json.dumps(HOSTILE).replace("</", "<\\/") + "</body>"))
    p = subprocess.run(["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                        "--disable-component-update", "--no-first-run", "--disable-sync", f"--user-data-dir={tmp_path / 'ud'}",
                        "--allow-file-access-from-files", "--virtual-time-budget=5000", "--dump-dom", probe.as_uri()],
                       capture_output=True, text=True, timeout=120)
    m = re.search(r'data-check="([^"]*)"', p.stdout)
    assert m, p.stdout[-2000:] + p.stderr[-2000:]
    check = json.loads(m.group(1).replace("&quot;", '"').replace("&amp;", "&").replace("&lt;", "<").replace("&gt;", ">"))
    assert len(check["imgs"]) == 3 and all(check["imgs"]), check
    assert len(check["tables"]) >= 3 and all(n >= 2 for n in check["tables"]), check
    assert check["hostile"] and check["injected"] == 0


def test_mlperf_aggregation_and_prices():
    from speechperf.report.aggregate import price_rows, repeated_rows

    def run(seed, cers, platform=None):
        evals = [{"clock_s": 60.0 * (i + 1), "cer": c, "wer": 2 * c} for i, c in enumerate(cers)]
        return {"label": f"s{seed}", "config": {"preset": "cpu", "train": {"seed": seed}}, "row": {"seed": seed},
                "evals": evals, "env": {"platform": platform}, "samples": []}

    runs = [run(1, [9, 9, 9]), run(2, [20, 9, 9, 9]), run(3, [20, 20, 9, 9, 9]), run(4, [20, 20, 20, 9, 9, 9]),
            run(5, [20, 20])]
    (row,) = repeated_rows(runs)
    # median of the last 3 epochs first <= 10 at minutes 3, 3, 4, 5 and one NA:
    # drop one 3 and the 5, mean of 3 and 4
    assert (row["runs"], row["never reached"], row["MLPerf mean TTA min"], row["median TTA min"]) == (5, 1, 3.5, 3.5)
    rows = price_rows([run(1, [9, 9, 9], platform="sys1")])
    assert rows[0]["TTA x price ($ min)"] == pytest.approx(3 * 2605.29)
    paper = {r["platform"]: r for r in rows[1:]}
    assert paper["Sys10$"]["TTA x price ($ min)"] == pytest.approx(511 * 25999.0)


def test_bench_and_parallel_sections_from_the_database(recorded_run, tmp_path):
    from speechperf.bench.ops import run_ops
    from speechperf.metrics.tta import read_run_info

    db = read_run_info(recorded_run)["db"]
    run_ops("cpu", threads=[1], quick=True, cpu_seconds=0.05, db_path=db)
    page = build_report([recorded_run], tmp_path / "rep").read_text()
    assert "achieved TFLOPS" in page and (tmp_path / "rep" / "ops.csv").exists()
    assert "no parallel sweep in this database" in page
