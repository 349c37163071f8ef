"""The live status line shows the run's target metric (speechperf/metric.py), by its label."""
import io

import pytest

from speechperf.metric import DEFAULT_TARGET, SER, MetricError
from speechperf.telemetry.status import StatusLine


class Terminal(io.StringIO):
    def isatty(self):
        return True


def test_the_status_line_shows_the_runs_target_metric():
    out = Terminal()
    StatusLine(SER.name, stream=out, every=0.0).update(2, 40, 1.5, 8.0, 42.125, 90.0)
    assert out.getvalue() == "\repoch 2 it 40 loss    1.500    8.0 utt/s SER 42.12 TTA clock   1.50 min "
    before = Terminal()
    StatusLine(DEFAULT_TARGET, stream=before, every=0.0).update(1, 3, 2.0, 8.0, None, 6.0)
    assert " - TTA clock" in before.getvalue()  # no evaluation yet: no value, never 0


def test_a_metric_that_is_not_declared_is_refused():
    with pytest.raises(MetricError, match="unknown metric 'xer'"):
        StatusLine("xer", stream=Terminal())
