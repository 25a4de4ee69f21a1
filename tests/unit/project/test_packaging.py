"""The wheel's contents: every package folder is installed as `partita.*`, and every shipped data
file matches the package-data patterns (`.ci/wheel-smoke` then installs the wheel for real)."""
from __future__ import annotations

import fnmatch
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def _setuptools() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]


def test_every_package_folder_is_listed_under_partita():
    cfg = _setuptools()
    listed = set(cfg["packages"])
    found = set()
    for name, folder in cfg["package-dir"].items():
        base = ROOT / folder
        for init in base.rglob("__init__.py"):
            rel = init.parent.relative_to(base)
            found.add(".".join([name, *rel.parts]) if rel.parts else name)
    assert found - listed == set(), "package folders missing from pyproject's packages list"
    assert all(p == "partita" or p.startswith("partita.") for p in listed)


def test_every_data_file_is_package_data():
    patterns = _setuptools()["package-data"]["partita.data"]
    files = [p.relative_to(ROOT / "data").as_posix() for p in (ROOT / "data").rglob("*")
             if p.is_file() and "__pycache__" not in p.parts]
    missing = [f for f in files if not any(fnmatch.fnmatch(f, pat) or
                                           fnmatch.fnmatch(f, pat.removeprefix("**/"))
                                           for pat in patterns)]
    assert missing == []


def test_version_is_one_string():
    from partita import __version__
    from partita.cli import build_parser
    import contextlib, io
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
        build_parser().parse_args(["--version"])
    assert out.getvalue().strip() == f"partita {__version__}"
