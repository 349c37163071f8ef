"""A run's workload: its model's name and trainable parameters, from config.json's model section."""
from speechperf.models import build_model, model_config
from speechperf.results.workload import UNRECORDED, by_workload, workload, workload_label

TINY = {"name": "ds2", "conv_channels": 8, "lstm_layers": 1, "lstm_hidden": 8}


def test_the_model_and_its_parameters_as_built():
    w = workload({"model": TINY})
    assert w == {"model": "ds2", "params": sum(p.numel() for p in build_model(model_config(TINY)).parameters())}
    assert workload_label(w) == f"ds2, {w['params'] / 1e6:.3g} M params"


def test_unknown_or_unrecorded_models_keep_their_name():
    assert workload({"preset": "x"}) == {"model": UNRECORDED, "params": None}
    assert workload({"model": {"name": "ds2", "a_field_of_a_newer_release": 1}}) == {"model": "ds2", "params": None}
    assert workload_label({"model": "wav2vec9", "params": None}) == "wav2vec9"


def test_grouped_in_order_of_first_appearance():
    items = [("a", {"model": TINY}), ("b", {"model": {**TINY, "lstm_hidden": 16}}), ("c", {"model": TINY})]
    groups = by_workload(items, lambda it: workload(it[1]))
    assert [[name for name, _ in members] for members in groups.values()] == [["a", "c"], ["b"]]
