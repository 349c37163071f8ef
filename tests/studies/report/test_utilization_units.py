from speechperf.studies.report import figures


def _run(label, cpu_metrics):
    samples = []
    for k in range(100):
        t = 0.03 * k
        samples += [{"t": t, "source": "cpu", "metric": m, "value": v} for m, v in cpu_metrics]
        if k % 5 == 0:
            samples.append({"t": t, "source": "gpu0", "metric": "util_pct", "value": 80.0})
    return {"label": label, "samples": samples}


def test_fig8_plots_cpu_in_percent_of_the_machine_and_labels_old_runs(tmp_path, monkeypatch):
    drawn = []
    monkeypatch.setattr(figures, "save_png", lambda fig, path: drawn.append(fig) or path)
    runs = [_run("new", [("util_machine_pct", 40.0), ("util_core_pct", 640.0)]), _run("old", [("util_pct", 640.0)])]
    assert figures.utilization_window(runs, tmp_path / "f.png")[0] is not None
    new, old = drawn[0].axes
    assert [line.get_label() for line in new.lines] == ["cpu (% of the machine)", "gpu0 (% of the GPU)"]
    assert set(new.lines[0].get_ydata()) == {40.0}  # not the per-core series
    assert [line.get_label() for line in old.lines] == ["cpu (% of one core)", "gpu0 (% of the GPU)"]
    assert "cpu every 30 ms (n = 100), gpu0 every 150 ms (n = 20)" in new.get_title()
