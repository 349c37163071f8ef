"""The run folder's file names are spelled in results/layout.py alone: every other module of the
package names them through its constants, so a rename there renames them everywhere."""
import ast
from pathlib import Path

import speechperf
from speechperf.results import layout

NAMES = {layout.RUN_FILE, layout.CONFIG_FILE, layout.ENV_FILE, layout.DB_FILE, layout.EVENTS_FILE,
         layout.SENTENCES_FILE, layout.CHECKPOINT_FILE, layout.SUMMARY_FILE}
PACKAGE = Path(speechperf.__file__).parent


def _spelled(path: Path, root: Path = PACKAGE) -> list[str]:
    """String constants of ``path`` that name a run folder's file (``"events.log"``, ``".../events.log"``),
    docstrings and help text aside (they end otherwise)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            if any(node.value == n or node.value.endswith("/" + n) for n in NAMES):
                found.append(f"{path.relative_to(root)}:{node.lineno}: {node.value!r}")
    return found


def test_the_file_names_are_spelled_in_layout_alone():
    spelled = [hit for p in sorted(PACKAGE.rglob("*.py")) if p != PACKAGE / "results" / "layout.py"
               for hit in _spelled(p)]
    assert spelled == []


def test_the_check_finds_a_spelled_name(tmp_path):
    """The test's own check: a module spelling one is found."""
    module = tmp_path / "spelled.py"
    module.write_text('"""A docstring naming events.log."""\nPATH = "run/events.log"\nNAME = "summary.json"\n')
    assert len(_spelled(module, tmp_path)) == 2


def test_events_log_takes_a_run_folder_or_its_log(tmp_path):
    assert layout.events_log(tmp_path) == tmp_path / "events.log"
    assert layout.events_log(tmp_path / "x.log") == tmp_path / "x.log"
    assert not layout.has_checkpoint(tmp_path)
    (tmp_path / "checkpoint.pt").write_bytes(b"")
    assert layout.has_checkpoint(tmp_path)
