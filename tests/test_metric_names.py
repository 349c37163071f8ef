"""Metric names are data: no module spells one but speechperf/metric.py, which declares them,
and speechperf/scoring/error_rates.py, which computes them. Every other module reads the
declarations (a name, its ``last_NAME``/``NAME_lo``/``NAME_hi`` keys, its label or header), so
that a metric declared, renamed or made the default is one edit; the one default target is
``metric.DEFAULT_TARGET``."""
import ast
import io
import tokenize
from pathlib import Path

import pytest

import speechperf
from speechperf import metric

PACKAGE = Path(speechperf.__file__).parent
ALLOWED = {PACKAGE / "metric.py", PACKAGE / "scoring" / "error_rates.py"}
NAMES = ("cer", "wer", "cer_paper", "ser")  # the metrics this release declares (also caught if renamed)


def spellings() -> set[str]:
    """Every string that spells a declared metric: its name and the keys built from it, its
    label and its table header."""
    out = set(NAMES)
    for name, m in metric.METRICS.items():
        out |= {name, f"last_{name}", f"{name}_lo", f"{name}_hi", m.label, m.header}
    return out


def _strings(token: tokenize.TokenInfo) -> list[str]:
    """The string constants in a STRING token, the parts and the expressions of an f-string
    included (``f"{r['wer']:.2f}"`` holds "wer"); Python 3.12 splits f-strings into tokens of
    their own (FSTRING_MIDDLE), whose expressions are ordinary tokens."""
    if token.type == getattr(tokenize, "FSTRING_MIDDLE", None):
        return [token.string]
    if token.type != tokenize.STRING:
        return []
    tree = ast.parse(token.string.strip(), mode="eval")
    return [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)]


def literal_names(source: str, where: str) -> list[str]:
    """``where:LINE: 'wer'`` for each string literal of ``source`` that spells a metric."""
    words = spellings()
    found = []
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        found += [f"{where}:{token.start[0]}: {s!r}" for s in _strings(token) if s in words]
    return found


def test_no_module_but_the_declarations_and_the_computation_spells_a_metric_name():
    files = sorted(p for p in PACKAGE.rglob("*.py") if p not in ALLOWED)
    assert len(files) > 100  # the whole package is read, not a folder of it
    found = [hit for p in files for hit in literal_names(p.read_text(encoding="utf-8"), str(p.relative_to(PACKAGE.parent)))]
    assert found == [], "metric names spelled outside speechperf/metric.py (read its declarations):\n" + "\n".join(found)


def test_the_scan_finds_a_name_in_every_form_and_leaves_prose_alone():
    source = '''"""Docstring: WER and CER per beam width."""
x = row["wer"]
y = f"{r['cer']:.2f} and {r['ser_hi']}"
z = summary.get("last_wer"), {"CER %": 1}, "CER paper"
w = "WER 12"  # prose: not a key
'''
    assert literal_names(source, "m.py") == ["m.py:2: 'wer'", "m.py:3: 'cer'", "m.py:3: 'ser_hi'",
                                             "m.py:4: 'last_wer'", "m.py:4: 'CER %'", "m.py:4: 'CER paper'"]


def test_one_default_target_everywhere():
    from speechperf.cli import build_parser
    from speechperf.config.training import TrainConfig
    from speechperf.scoring.targets import Targets

    assert metric.DEFAULT_TARGET in metric.targets()
    assert TrainConfig().stop.target_metric == Targets().metric == metric.DEFAULT_TARGET
    parser = build_parser()
    for command in ("tta", "report"):
        args = ["report", "RUN", "--out", "OUT"] if command == "report" else ["tta", "RUN"]
        assert parser.parse_args(args).metric == metric.DEFAULT_TARGET
        with pytest.raises(SystemExit):  # a metric that is no target (cer_paper) is not a choice
            parser.parse_args([*args, "--metric", metric.CER_PAPER.name])
