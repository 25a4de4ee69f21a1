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
