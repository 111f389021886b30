"""The readme_setup marker, declared here rather than in pyproject.toml (whose hash stamps .venv-verl's setup)."""

from __future__ import annotations

import pytest


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "readme_setup: the README's Set up in a fresh clone (slow: installs from PyPI; "
                            "pytest -m readme_setup tests/setup)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Only when asked for (`-m readme_setup`): a plain `pytest` over tests/ must not start a 30-minute install."""
    if "readme_setup" in (config.option.markexpr or ""):
        return
    skip = pytest.mark.skip(reason="slow (a fresh clone's installs and the tiny run): select it with -m readme_setup")
    for item in items:
        if item.get_closest_marker("readme_setup") and "fresh_clone" in item.name:
            item.add_marker(skip)
