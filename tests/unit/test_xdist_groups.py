"""The unit tests run with `pytest -n 2 --dist loadgroup` (tools/run-tests.sh), and some modules rely on their
xdist_group: the sandbox tables count the machine's SysV IPC keys (a table beside them would change the count), and
module fixtures that cost a minute (a megatron-core probe, a trl run) must be built once. With pytest 9.2 and
pytest-xdist 3.8 every group was silently ignored (pyproject.toml's pin says why): this runs a grouped module under
xdist and asserts one worker ran it all."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

GROUPED = """
import pytest

pytestmark = pytest.mark.xdist_group("together")


@pytest.mark.parametrize("i", range(6))
def test_member(i):
    pass
"""


def test_an_xdist_group_runs_on_one_worker(tmp_path: Path) -> None:
    (tmp_path / "test_grouped.py").write_text(GROUPED)
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-n", "2", "--dist", "loadgroup",
                           "-v", "test_grouped.py"], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                          check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    ran = re.findall(r"\[(gw\d+)\].*PASSED test_grouped.py::test_member\[(\d)\]", proc.stdout)
    assert sorted(int(i) for _, i in ran) == list(range(6)), proc.stdout[-3000:]
    assert len({worker for worker, _ in ran}) == 1, ran
