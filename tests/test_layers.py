"""The package's import layers (pyproject.toml [tool.importlinter]) hold: no module imports a
higher layer, and no two packages or modules import each other (lint-imports' exit status); no
two modules or packages share a name."""
import os
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_import_contracts_are_kept():
    exe = shutil.which("lint-imports") or str(Path(sys.executable).with_name("lint-imports"))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}  # this checkout's package
    done = subprocess.run([exe, str(ROOT / "pyproject.toml"), "--no-cache"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"lint-imports: a layer or cycle contract is broken:\n{done.stdout[-4000:]}{done.stderr[-2000:]}"


def test_no_two_modules_or_packages_share_a_name():
    """A name says which module it is (``__init__`` and ``__main__`` aside): no metric.py beside a
    metrics/, no two config.py."""
    package = ROOT / "speechperf"
    names = Counter([p.stem for p in package.rglob("*.py") if not p.stem.startswith("__")]
                    + [p.parent.name for p in package.rglob("__init__.py") if p.parent != package])
    assert len(names) > 100  # the whole package was read
    assert [name for name, n in names.items() if n > 1] == []


def test_no_contract_ignores_an_import():
    """No import climbs by exception: what a lower tier needs from a higher one is handed down."""
    import tomllib

    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    assert len(contracts) == 4 and [c["name"] for c in contracts if c.get("ignore_imports")] == []


def test_importing_the_package_leaves_torch_compile_unloaded():
    """No module of the package imports torch's compiler stack (dynamo, inductor) when imported:
    it costs 2 s of every process's start on a 2-core CPU (7.1 against 4.3 s for ``speechperf
    --help``), in every command that never compiles. ``train.system.compile`` loads it when asked."""
    code = ("import importlib, pkgutil, sys, speechperf\n"
            "names = [m.name for m in pkgutil.walk_packages(speechperf.__path__, 'speechperf.')\n"
            "         if not m.name.endswith('__main__')]\n"
            "for n in names: importlib.import_module(n)\n"
            "loaded = sorted(m for m in ('torch._dynamo', 'torch._inductor') if m in sys.modules)\n"
            "print(len(names), ' '.join(loaded))\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    count, *loaded = done.stdout.split()
    assert int(count) > 100 and loaded == [], f"imported by the package: {loaded}"
