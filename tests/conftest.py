"""Shared pytest options and fixtures.

`pytest --update-golden` rewrites the files under tests/golden/ from the current code instead of
comparing against them; golden files change only that way, on purpose, and the diff is reviewed.
"""
from __future__ import annotations

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--update-golden", action="store_true", default=False,
                     help="rewrite tests/golden/* from the current code instead of comparing")


@pytest.fixture
def update_golden(request: pytest.FixtureRequest) -> bool:
    return bool(request.config.getoption("--update-golden"))
