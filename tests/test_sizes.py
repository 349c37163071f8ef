"""No class in the package over 20 methods and no function over 50 lines but the numeric
kernels named here: a newcomer reads each in one sitting (read from the source, ast)."""
import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "speechperf"
MAX_METHODS, MAX_LINES = 20, 50
KERNELS = {"decode/kernel.py:beam_search"}  # a numeric kernel's loop reads best whole


def _defs():
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            yield path.relative_to(PACKAGE).as_posix(), node


def test_no_class_has_more_than_20_methods():
    big = {f"{where}:{node.name}": n for where, node in _defs() if isinstance(node, ast.ClassDef)
           for n in [sum(isinstance(b, (ast.FunctionDef, ast.AsyncFunctionDef)) for b in node.body)] if n > MAX_METHODS}
    assert big == {}, f"classes over {MAX_METHODS} methods: {big}"


def test_no_function_is_longer_than_50_lines_but_the_kernels():
    long = {f"{where}:{node.name}": node.end_lineno - node.lineno + 1 for where, node in _defs()
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno >= MAX_LINES}
    assert set(long) - KERNELS == set(), f"functions over {MAX_LINES} lines: {long}"
