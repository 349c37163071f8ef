from speechperf.bench import ops, plots, zoo
from speechperf.results import ResultsDB


def _zoo_rows():
    m = lambda s: {"samples_per_s": s, "step_s": 1.0, "iters": 3, "spread_pct": 1.0, "power_w": None, "joules_per_sample": None, "energy": "-"}  # noqa: E731
    return [zoo._row("lstm", b, p, "cpu", 66.0, m(b * k)) for b in (64, 128) for p, k in (("fp32", 1), ("amp", 2))]


def test_figures_are_png_or_say_why(tmp_path):
    png, why = plots.zoo_throughput_vs_batch(_zoo_rows(), tmp_path / "z.png")
    assert png.read_bytes()[:4] == b"\x89PNG" and why == ""
    rows = ops.run_ops("cpu", dtypes=["fp32"], threads=[1, 2], quick=True, seconds=0.02, warmup_seconds=0)
    for draw in (plots.thread_scaling, plots.percent_of_peak):
        png, why = draw(rows, tmp_path / f"{draw.__name__}.png")
        assert png.read_bytes()[:4] == b"\x89PNG", why
    one_count = [r for r in rows if r["threads"] == 1]
    png, why = plots.thread_scaling(one_count, tmp_path / "t.png")
    assert png is None and "one thread count" in why and not (tmp_path / "t.png").exists()
    failed = [{**r, "status": "failed: x"} for r in _zoo_rows()]
    assert plots.zoo_throughput_vs_batch(failed, tmp_path / "f.png") == (None, "no successful zoo measurement")


def test_draw_all_from_the_database(tmp_path):
    db_path = tmp_path / "r.db"
    zoo._store(_zoo_rows(), db_path)
    with ResultsDB(db_path) as db:
        drawn = {name: (png, why) for name, png, why in plots.draw_all(db, tmp_path)}
    assert drawn["zoo_throughput_vs_batch"][0].exists()
    assert drawn["thread_scaling"] == (None, "no bench_ops table in this database")
