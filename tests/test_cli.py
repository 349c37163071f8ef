"""The CLI explains itself: choices from the registries, defaults in --help, the parallel
sweep's options under ``speechperf parallel sweep --help``."""
import pytest

from speechperf.cli import build_parser, main


def _help(capsys, *argv) -> str:
    with pytest.raises(SystemExit) as e:
        build_parser().parse_args([*argv, "--help"])
    assert e.value.code == 0
    return " ".join(capsys.readouterr().out.split())


def test_help_shows_registry_choices_and_defaults(capsys):
    from speechperf.bench.zoo import ZOO
    from speechperf.config import preset_names
    from speechperf.decode import DECODERS

    text = _help(capsys, "eval")
    assert "--decoder {" + ",".join(sorted(DECODERS)) + "}" in text and "(default: wordbeam)" in text
    assert "(default: 256)" in text and "(default: 0)" in text
    text = _help(capsys, "train")
    assert all(p in text for p in preset_names()) and "(default: auto)" in text and "--label" in text
    text = _help(capsys, "bench", "zoo")
    assert ", ".join(sorted(ZOO)) in text
    assert "--sync-every" in _help(capsys, "parallel", "sweep") and "--set KEY=VALUE" in _help(capsys, "parallel", "sweep")


def test_bad_choices_are_refused_naming_them(capsys):
    for argv, said in ((["bench", "zoo", "--models", "resnet50,alexnet"], "alexnet not among"),
                       (["bench", "ops", "--dtype", "fp8"], "fp8 not among"),
                       (["train", "--preset", "huge", "--out", "x"], "unknown preset 'huge'"),
                       (["eval", "run", "--decoder", "magic"], "invalid choice: 'magic'")):
        with pytest.raises(SystemExit) as e:
            main(argv)
        assert e.value.code == 2 and said in capsys.readouterr().err


def test_every_command_has_its_place_in_the_help_and_every_place_a_command():
    from speechperf.cli import COMMANDS, GROUPS, ORDER

    tops = [c.group or c.name for c in COMMANDS]
    assert sorted(ORDER) == sorted(set(tops))  # ORDER: the order --help lists them in
    assert set(GROUPS) == {c.group for c in COMMANDS} - {None}
    names = [(c.group, c.name) for c in COMMANDS]
    assert len(names) == len(set(names))
