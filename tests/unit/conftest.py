"""Order of the unit tests under xdist (tools/run-tests.sh: `-n 2 --dist loadgroup`)."""

from __future__ import annotations

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
