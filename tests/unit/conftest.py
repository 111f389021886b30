"""Order of the unit tests under xdist (tools/run-tests.sh: `-n 2 --dist loadgroup`)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# The longest xdist groups, started first: a worker takes the next group or test as it frees, so a group of several
# minutes started last runs alone at the end (trl's three training runs, ~520 s in one group, did: the unit phase
# took 20.7 min instead of ~16).
FIRST = ("test_trl_train.py", "test_megatron_cpu.py", "test_code_reward_attacks.py")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    here = Path(__file__).parent

    def rank(item: pytest.Item) -> int:
        path = Path(str(item.fspath))
        return FIRST.index(path.name) if path.parent == here and path.name in FIRST else len(FIRST)

    items.sort(key=rank)


@pytest.fixture(scope="session")
def probe_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tests/conftest.py's probe cache, shared by the xdist workers of this session (their base temp folders are
    siblings in the session's own): each cold probe of verl's venv is 10-30 s of CPU, and either worker may be the
    first to plan a verl recipe. Answers are written atomically, so two workers at once at worst probe twice."""
    base = tmp_path_factory.getbasetemp()
    folder = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "python-probe-shared"
    folder.mkdir(exist_ok=True)
    return folder
