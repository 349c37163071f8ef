"""Every data file the package reads at run time (presets, platforms, reference convergence
points, word lists, the MLPerf rules) is named by pyproject.toml's package-data: an
editable install reads them from the source tree, a wheel only carries what is named."""
import fnmatch
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_every_data_file_of_the_package_is_in_package_data():
    spec = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    data = [p for p in (ROOT / "speechperf").rglob("*")
            if p.is_file() and p.suffix not in (".py", ".pyc") and "__pycache__" not in p.parts]
    assert any(p.parent.name == "rcp" for p in data)  # the check sees the files it is about
    missing = []
    for path in data:
        rel = path.relative_to(ROOT)
        package = ".".join(rel.parts[:-1])
        # the closest package that declares patterns, and the path under it
        owners = [k for k in spec if package == k or package.startswith(k + ".")]
        owner = max(owners, key=len, default=None)
        under = str(Path(*rel.parts[len(owner.split(".")):])) if owner else str(rel)
        if owner is None or not any(fnmatch.fnmatch(under, pat) for pat in spec[owner]):
            missing.append(str(rel))
    assert not missing, f"not in pyproject.toml's package-data: {missing}"
