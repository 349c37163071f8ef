from speechperf.config.training import TrainConfig, target_rule
from speechperf.metric import DEFAULT_TARGET


def test_a_recorded_run_s_target_rule_is_its_config_s_with_the_fields_defaults_where_missing():
    assert target_rule({}) == (DEFAULT_TARGET, 0.0, 3) == (TrainConfig().target_metric, TrainConfig().target,
                                                          TrainConfig().target_epochs)
    assert target_rule({"target_metric": "wer", "target": 12.5, "target_epochs": 1}) == ("wer", 12.5, 1)
    assert target_rule({"target": 10.0}) == (DEFAULT_TARGET, 10.0, 3)
