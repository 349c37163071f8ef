"""benchmarks/bench_op_trace.py: a preset's first steps traced under the cap, compared with another
maker's stored trace op for op."""
import importlib
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
bench = importlib.import_module("bench_op_trace")
from speechperf.hardware.op_trace import by_maker  # noqa: E402

SETTINGS = {"cpu_vendor": "AMD", "torch": "2.13.0+cpu", "features_sha256": "ab", "cap": "avx2", "steps": 2,
            "precision": "fp32", "optim_impl": "default"}
OPS = [["aten.uniform_.default", "4x3", "aaa"], ["aten.mm.default", "2x4,4x3", "bbb"], ["aten.add.Tensor", "2x3,3", "ccc"]]


def test_a_trace_is_compared_with_every_stored_maker_and_names_the_first_op_that_differs():
    mine = {"settings": SETTINGS, "ops": OPS}
    intel = {"settings": {**SETTINGS, "cpu_vendor": "Intel"}, "ops": [OPS[0], [*OPS[1][:2], "xxx"], [*OPS[2][:2], "yyy"]]}
    rows = bench.compared("cpu", mine, {"traces": {"AMD": mine, "Intel": intel}})
    assert [r["against"] for r in rows] == ["AMD", "Intel"]
    assert rows[0]["verdict"] == "same: every op" and rows[0]["first difference"] == 3
    assert rows[1]["first difference"] == 1 and rows[1]["differing after"] == 2
    assert rows[1]["verdict"] == "op 1 aten.mm.default (2x4,4x3) computes otherwise"
    other = {"settings": {**SETTINGS, "cpu_vendor": "Intel"}, "ops": [OPS[0], ["aten.addmm.default", "3,2x4,4x3", "z"]]}
    row = bench.compared("cpu", mine, {"traces": {"Intel": other}})[0]
    assert row["verdict"] == ("op 1: aten.mm.default (2x4,4x3) here, aten.addmm.default (3,2x4,4x3) there "
                              "(the dispatch chose otherwise)")


def test_traces_of_other_torch_features_or_recipe_are_not_compared():
    mine = {"settings": SETTINGS, "ops": OPS}
    for key, value in (("torch", "2.12.0+cpu"), ("features_sha256", "cd"), ("optim_impl", "fused")):
        theirs = {"settings": {**SETTINGS, "cpu_vendor": "Intel", key: value}, "ops": OPS}
        row = bench.compared("cpu", mine, {"traces": {"Intel": theirs}})[0]
        assert not row["comparable"] and row["verdict"].startswith(f"cannot be compared: {key} ")
    assert bench.compared("cpu", mine, {"traces": {}})[0]["verdict"].startswith("no stored trace")


def test_the_stored_traces_are_of_the_references_recipe_and_corpus():
    """Each stored trace was made under the cap at the reference's precision, on the references' corpus."""
    for path in sorted((ROOT / "benchmarks" / "op_traces").glob("*.json")):
        stored = json.loads(path.read_text())
        assert stored["preset"] == path.stem and stored["traces"]
        for vendor, t in stored["traces"].items():
            s = t["settings"]
            assert s["cpu_vendor"] == vendor and s["cap"] == "avx2" and s["precision"] == "fp32" and len(t["ops"]) > 100
            assert s["features_sha256"], path
            assert by_maker(t["ops"]) == {}, (path, vendor)  # no op whose CPU code follows the maker


def test_the_child_traces_the_same_ops_twice_on_the_tiny_corpus(tiny_features):
    a = bench.trace_in_child("tiny", tiny_features, 1)
    b = bench.trace_in_child("tiny", tiny_features, 1)
    assert a == b and a["settings"]["cap"] == "avx2" and a["settings"]["steps"] == 1
    names = {op for op, _, _ in a["ops"]}
    assert {"aten.convolution.default", "aten.mkldnn_rnn_layer.default", "aten.addmm.default"} <= names


def test_the_ratio_is_where_the_other_makers_trace_parts(monkeypatch, tmp_path, capsys):
    """The figure the ledger keeps: the first differing op over the ops traced, against another
    maker's trace only (this maker's own stored trace is a check of the tool, not the ratio)."""
    import argparse

    mine = {"settings": {**SETTINGS, "machine": "AMD EPYC", "kernels": None}, "ops": OPS}
    intel = {"settings": {**SETTINGS, "cpu_vendor": "Intel"}, "ops": [OPS[0], [*OPS[1][:2], "xxx"], OPS[2]]}
    monkeypatch.setattr(bench, "trace_in_child", lambda preset, data, steps: mine)
    monkeypatch.setattr(bench, "load", lambda preset: {"preset": preset, "traces": {"AMD": mine, "Intel": intel}})
    got = bench.run(argparse.Namespace(preset=["cpu"], data=tmp_path, steps=2, write=False, json=True))
    assert got["ratio"] == 1 / 3 and got["presets"]["cpu"]["ops"] == 3
    rows = json.loads(capsys.readouterr().out)
    assert [r["verdict"] for r in rows] == ["same: every op", "op 1 aten.mm.default (2x4,4x3) computes otherwise"]
