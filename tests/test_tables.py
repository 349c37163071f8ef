"""Text tables fit 100 columns unless asked to be wide: cells cut, then the last columns left
out and named; notes wrapped; --json untouched."""
import io
import json

from speechperf import tables

ROWS = [{"run": "a run with a rather long name", "minutes": 3.25, "note": "x" * 150, "tail": "last"},
        {"run": "b", "minutes": None, "note": "short", "tail": "end"}]


def _text(rows, columns=None, width=tables.WIDTH) -> list[str]:
    out = io.StringIO()
    tables.emit(rows, False, columns=columns, out=out, width=width)
    return out.getvalue().splitlines()


def test_a_wide_table_is_cut_to_the_width_widest_cell_first():
    lines = _text(ROWS)
    assert max(map(len, lines)) == tables.WIDTH
    assert "a run with a rather long name" in lines[2] and "3.25" in lines[2]  # narrow cells stay whole
    assert lines[2].split()[-2].endswith(tables.CUT)  # the 150-character note, cut


def test_the_first_column_names_the_row_and_is_cut_last():
    """A run's label outlasts wider other cells: on a machine whose figures print wider (a
    4-digit TTA, "evaluation 52%") a label cut to "2-core Xeon ti~" lost the run's preset."""
    rows = [{"run": "2-core Xeon tiny fp32 r1", **{f"c{i}": "y" * 20 for i in range(4)}}]
    lines = _text(rows)
    assert max(map(len, lines)) == tables.WIDTH and lines[2].split()[:4] == ["2-core", "Xeon", "tiny", "fp32"]
    label = _text([{"run": "r" * 120, **{f"c{i}": "y" * 20 for i in range(5)}}])[2]
    assert len(label) == tables.WIDTH and label.startswith("r" * (tables.LABEL - 1) + tables.CUT + "  ")


def test_wide_prints_every_cell_whole_as_before():
    lines = _text(ROWS, width=None)
    assert "x" * 150 in lines[2] and lines == tables.format_table(ROWS).splitlines()


def test_columns_that_cannot_fit_are_left_out_last_first_and_named():
    rows = [{f"column {i}": 1000.5 + i for i in range(12)}]
    lines = _text(rows)
    assert all(len(line) <= tables.WIDTH for line in lines)
    kept = lines[0].split("  ")
    assert lines[0].split()[:2] == ["column", "0"] and lines[-1].startswith("(left out: ")
    assert "column 11" in lines[-1] and "--wide shows them" in lines[-1] and "column 11" not in kept


def test_json_holds_every_key_whatever_the_columns():
    out = io.StringIO()
    tables.emit(ROWS, True, columns=["run"], out=out)
    assert json.loads(out.getvalue()) == ROWS


def test_notes_are_wrapped_to_the_width_or_whole_when_wide():
    out = io.StringIO()
    tables.print_lines(["word " * 50, "short"], out=out)
    lines = out.getvalue().splitlines()
    assert all(len(line) <= tables.WIDTH for line in lines) and lines[1].startswith("  ") and lines[-1] == "short"
    out = io.StringIO()
    tables.print_lines(["word " * 50], width=None, out=out)
    assert out.getvalue() == "word " * 50 + "\n"


def test_pick_renames_and_orders_columns():
    assert tables.pick(ROWS[:1], {"minutes": "min", "run": "run"}) == [{"min": 3.25, "run": ROWS[0]["run"]}]


def test_a_path_cut_keeps_its_end():
    assert tables.fit_line("/a/long/path/to/the/run", 10) == "~o/the/run" and tables.fit_line("ab cd", 4) == "ab ~"


def test_control_characters_in_cells_headers_and_notes_are_shown_escaped():
    """A label from a run folder made elsewhere (a newline, an ANSI escape) cannot break a row or
    drive the terminal."""
    label = "a\nb\x1b[31mred\x07"
    text = tables.format_table([{"run": label, "x\rcol": 1}])
    assert "\n" not in text.split("\n", 2)[2] and "\x1b" not in text and "\r" not in text and "\x07" not in text
    assert "a\\nb\\x1b[31mred\\x07" in text and "x\\rcol" in text
    out = io.StringIO()
    tables.notes([{"run": label, "note": "ok\x1b[2J"}], "note", out=out)
    assert out.getvalue() == "note: a\\nb\\x1b[31mred\\x07: ok\\x1b[2J\n"
    out = io.StringIO()
    tables.emit([{"run": label}], True, out=out)
    assert json.loads(out.getvalue()) == [{"run": label}]  # --json keeps the value itself (JSON escapes it)
