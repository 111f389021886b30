"""The readme_setup marker, declared here rather than in pyproject.toml (whose hash stamps .venv-verl's setup)."""

from __future__ import annotations

import pytest


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "readme_setup: the README's Set up in a fresh clone (slow: installs from PyPI; "
                            "pytest -m readme_setup tests/setup)")
