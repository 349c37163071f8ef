"""speechperf/registry.py: a lookup imports the built-in modules in order up to the one that
registers the name; listing the names imports them all; a name registered twice, an unknown
name, a listed module that does not exist and a module whose own import fails."""
import sys
import uuid

import pytest

from speechperf.registry import Registry, UnknownName


@pytest.fixture
def modules(tmp_path, monkeypatch):
    """``make(**sources)``: modules of those sources on the path, under names unique to the test;
    returns their names (dropped from sys.modules afterwards)."""
    made = []
    monkeypatch.syspath_prepend(str(tmp_path))

    def make(**sources) -> dict[str, str]:
        tag = uuid.uuid4().hex[:8]
        names = {k: f"reg_{k}_{tag}" for k in sources}
        for k, src in sources.items():
            (tmp_path / f"{names[k]}.py").write_text(src.format(**names))
        made.extend(names.values())
        return names

    yield make
    for name in made:
        sys.modules.pop(name, None)


def _registry_of(make, missing=False):
    """A registry over modules a (registers "a"), b (registers "b" and "c"), c (registers "d"),
    with a listed module that does not exist before b when ``missing``; its module names."""
    names = make(base="from speechperf.registry import Registry\nREG = Registry('thing')\n",
                 a="from {base} import REG\nREG.register('a')(1)\n",
                 b="from {base} import REG\nREG.register('b')(2)\nREG.register('c')(3)\n",
                 c="from {base} import REG\nREG.register('d')(4)\n")
    reg = __import__(names["base"]).REG
    reg.builtin = (names["a"], *(["reg_nothing_here_" + uuid.uuid4().hex[:8]] if missing else []), names["b"], names["c"])
    return reg, names


def test_a_lookup_imports_the_modules_up_to_the_one_that_registers_the_name(modules):
    reg, names = _registry_of(modules, missing=True)
    assert reg.lookup("a") == 1 and names["b"] not in sys.modules
    assert reg.lookup("c") == 3 and names["b"] in sys.modules and names["c"] not in sys.modules
    assert reg.lookup("b") == 2  # registered already: nothing imported
    assert names["c"] not in sys.modules
    assert reg.names() == ["a", "b", "c", "d"] and names["c"] in sys.modules


def test_an_unknown_name_lists_every_known_one(modules):
    reg, _ = _registry_of(modules)
    with pytest.raises(UnknownName, match=r"unknown thing 'z'; known: a, b, c, d$"):
        reg.lookup("z")


def test_a_name_registered_twice_is_refused(modules):
    reg, names = _registry_of(modules)
    reg.lookup("a")
    with pytest.raises(ValueError, match="thing 'a' registered twice"):
        reg.register("a")(5)
    assert reg.lookup("a") == 1


def test_a_module_whose_own_import_fails_is_not_skipped(modules):
    names = modules(a="import reg_no_such_dependency_xyz\n")
    reg = Registry("thing", [names["a"]])
    with pytest.raises(ModuleNotFoundError, match="reg_no_such_dependency_xyz"):
        reg.lookup("a")
    with pytest.raises(ModuleNotFoundError, match="reg_no_such_dependency_xyz"):
        reg.names()


def test_the_decoders_list_greedy_first():
    """Evaluation decodes with greedy by default: listed first, a lookup of it imports no other decoder."""
    from speechperf.decode import DECODERS

    assert DECODERS.builtin[0] == "speechperf.decode.greedy"
