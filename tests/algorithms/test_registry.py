"""A new algorithm is one file plus its name in the registry's list: written here as a module
of its own (a config with one field of its own, one hook), it is then a preset's [algo]
section, an override, a stored config that reads back, and a trainer the loop can build."""
import importlib
import sys
import textwrap

import pytest

from speechperf import algorithms as A
from speechperf.config import ConfigError, RunConfig, load_preset

NEW = '''
from dataclasses import dataclass

from speechperf.algorithms import register_algorithm
from speechperf.algorithms.bsp import BSP
from speechperf.algorithms.local_sgd import LocalSGDConfig


@dataclass(frozen=True)
class GossipConfig(LocalSGDConfig):
    """Averaging with a weight."""

    name: str = "gossip"  # the registry key
    weight: float = 0.5  # share of the mean taken at each synchronization, in (0, 1]

    def problems(self):
        return super().problems() + ([] if 0 < self.weight <= 1 else [f"algo.weight={self.weight} must be in (0, 1]"])


@register_algorithm("gossip", GossipConfig)
class Gossip(BSP):
    pass
'''


@pytest.fixture
def gossip(tmp_path, monkeypatch):
    """The one file, importable, and its name added to the registry's built-in list."""
    (tmp_path / "gossip_algorithm.py").write_text(textwrap.dedent(NEW))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(A.ALGORITHMS, "builtin", A.ALGORITHMS.builtin + ("gossip_algorithm",))
    monkeypatch.setattr(A.ALGORITHMS, "_loaded", False)
    yield
    dict.pop(A.ALGORITHMS, "gossip", None)
    sys.modules.pop("gossip_algorithm", None)
    importlib.invalidate_caches()


def test_a_new_algorithm_is_one_file_and_its_registry_name(gossip):
    conf = load_preset("tiny", ["algo.name=gossip", "algo.sync_every=4", "algo.weight=0.25"])
    assert (conf.algo.name, conf.algo.sync_every, conf.algo.weight) == ("gossip", 4, 0.25)
    assert RunConfig.from_dict(conf.to_dict()) == conf  # config.json reads back
    assert A.periodic("gossip") and A.names()[-1] == "gossip"
    algo = A.make_algorithm(conf.algo, world=1)
    assert type(algo).__name__ == "Gossip" and algo.cfg.weight == 0.25
    with pytest.raises(ConfigError, match=r"algo.weight=2.0 must be in \(0, 1\]"):
        load_preset("tiny", ["algo.name=gossip", "algo.weight=2"])


def test_a_config_whose_default_name_is_not_the_key_is_refused():
    from dataclasses import dataclass

    from speechperf.algorithms.base import AlgoConfig

    @dataclass(frozen=True)
    class Misnamed(AlgoConfig):
        name: str = "other"

    with pytest.raises(ValueError, match="algorithm 'x': its config's default name is 'other'"):
        A.register_algorithm("x", Misnamed)
