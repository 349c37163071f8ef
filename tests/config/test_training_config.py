from speechperf.config.training import TrainConfig, target_rule
from speechperf.metric import DEFAULT_TARGET


def test_a_run_s_target_rule_is_its_config_s():
    d = TrainConfig().stop
    assert (d.target_metric, d.target, d.target_epochs) == (DEFAULT_TARGET, 0.0, 3)
    rule = {"target_metric": d.target_metric, "target": d.target, "target_epochs": d.target_epochs}
    assert target_rule({"stop": rule}) == (DEFAULT_TARGET, 0.0, 3)
    assert target_rule({"stop": {"target_metric": "wer", "target": 12.5, "target_epochs": 1}}) == ("wer", 12.5, 1)
