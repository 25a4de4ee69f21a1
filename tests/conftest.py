"""Shared pytest options and fixtures.

`pytest --update-golden` rewrites the files under tests/golden/ from the current code instead of
comparing against them; golden files change only that way, on purpose, and the diff is reviewed.
"""
from __future__ import annotations

import os
import tempfile

import pytest


def pytest_configure(config: pytest.Config) -> None:
    """Tests never read or write the user's own ~/.partita (the `local` calibration) or catalog."""
    os.environ["PARTITA_HOME"] = tempfile.mkdtemp(prefix="partita-test-home-")
    os.environ.pop("PARTITA_CATALOG", None)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--update-golden", action="store_true", default=False,
                     help="rewrite tests/golden/* from the current code instead of comparing")


@pytest.fixture
def update_golden(request: pytest.FixtureRequest) -> bool:
    return bool(request.config.getoption("--update-golden"))


@pytest.fixture
def simulate_error(tmp_path, capsys):
    """`partita simulate` of a scenario document that must fail: exit 1 and one 'error:' line,
    which it returns."""
    import yaml
    from partita.cli import main

    def run(doc: dict) -> str:
        path = tmp_path / "bad.yaml"
        path.write_text(yaml.safe_dump(doc))
        assert main(["simulate", str(path)]) == 1
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("error: "), err
        return err[0]
    return run


@pytest.fixture(scope="session")
def dev_scenarios() -> dict:
    """The dev CSV's rows that map to a scenario, by row id (validation/rowmap.py)."""
    from partita.validation import rowrules
    from partita.validation.rowmap import map_row, read_rows
    rules = rowrules.load_rules()
    mapped = {row["id"]: map_row(row, rules) for row in read_rows()}
    return {k: m.scenario for k, m in mapped.items() if hasattr(m, "scenario")}


@pytest.fixture
def aten_ops():
    """Runs `fn()` under a TorchDispatchMode and returns the aten ops it ran, by name, in order."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Ops(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.names: list[str] = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.names.append(func.__name__.split(".")[0])
            return func(*args, **(kwargs or {}))

    def run(fn) -> list[str]:
        with Ops() as seen:
            fn()
        return seen.names
    return run


@pytest.fixture
def training_key_round_trip():
    """For a scenario document and a `training` key: the key's value after parsing, the value
    after writing the scenario back and parsing it again, and whether the written document holds
    the key at all (a default is left out)."""
    from partita.planner.scenario import parse_scenario

    def run(doc: dict, key: str) -> tuple:
        s = parse_scenario(doc)
        written = s.to_dict()["training"]
        return (getattr(s.training, key), getattr(parse_scenario(s.to_dict()).training, key),
                key in written)
    return run
