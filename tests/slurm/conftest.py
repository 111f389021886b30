"""Fixtures for tests against the real local Slurm cluster (tools/slurm-dev/start.sh).

The cluster is started once per session (idempotent: a healthy cluster is reused in about 0.2 s) and left
running afterwards: .ci/run or a developer stops it with tools/slurm-dev/stop.sh. Where this machine cannot run
it (not root, no apt-get and no slurmctld) the tests are skipped, except under CI=true, where they fail.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
START = REPO_ROOT / "tools" / "slurm-dev" / "start.sh"
START_TIMEOUT_S = 300


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "slurm: needs the real local Slurm cluster (tools/slurm-dev/start.sh)")
    config.addinivalue_line("markers", "slurm_lead: leads the scheduler-bound Slurm tests (it needs every node, or "
                            "it starts a run that waits out time limits while they run)")
    config.addinivalue_line("markers", "slurm_last: runs after every other Slurm test (it checks a run started early)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.slurm)
    # The cluster's own checks first, on an idle cluster (they name the nodes a job lands on; a cancelled 2-node
    # job leaves its nodes completing for a few seconds). Then verl's runs (their modules hold
    # tests/conftest.verl_slot): CI runs this stream beside the unit tests. Then the scheduler-bound tests (waits
    # on ticks, grace times, time limits), beside the local verl runs: led by those marked slurm_lead (a job on
    # all four nodes; then, with the `chained` fixture, the start of a run that mostly waits, the chained run's two
    # time limits, ~3 min, on one node), and ended by those marked slurm_last, which check it. Checked at its
    # module's end, that wait was the stream's idle tail (CI run 8: 178 s).
    def order(item: pytest.Item) -> int:
        path = Path(str(item.fspath))
        if here not in path.parents:
            return 4
        if path.name == "test_cluster.py":
            return 0
        if "verl_slot" in item.fixturenames:
            return 1
        if item.get_closest_marker("slurm_lead"):
            return 3 if "chained" in item.fixturenames else 2  # a job that needs every node goes before it
        return 5 if item.get_closest_marker("slurm_last") else 4
    items.sort(key=order)


def _cannot_run_reason() -> str | None:
    if os.geteuid() != 0:
        return "the local Slurm cluster needs root (munged, slurmd, mknod)"
    if shutil.which("apt-get") is None and shutil.which("slurmctld") is None:
        return "no slurmctld installed and no apt-get to install it"
    return None


def _unavailable(reason: str) -> None:
    if os.environ.get("CI") == "true":
        pytest.fail(f"CI=true but the Slurm tests cannot run: {reason}", pytrace=False)
    print(f"\nskipping Slurm tests: {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[Path]:
    """Start (or reuse) the slurm-dev cluster; set SLURM_CONF for this process and its children; yield its dir."""
    reason = _cannot_run_reason()
    if reason:
        _unavailable(reason)
    state_dir = Path(os.environ.get("SLURM_DEV_DIR") or REPO_ROOT / ".slurm-dev")
    try:
        proc = subprocess.run(
            ["bash", str(START)],
            capture_output=True,
            text=True,
            timeout=START_TIMEOUT_S,
            stdin=subprocess.DEVNULL,
            env={**os.environ, "SLURM_DEV_DIR": str(state_dir)},
            check=False,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"{START} did not finish in {START_TIMEOUT_S}s (logs: {state_dir}/log)", pytrace=False)
    if proc.returncode != 0:
        pytest.fail(
            f"{START} failed (exit {proc.returncode}):\n{proc.stdout}\n{proc.stderr}\n(logs: {state_dir}/log)",
            pytrace=False,
        )
    os.environ["SLURM_CONF"] = str(state_dir / "etc" / "slurm.conf")
    yield state_dir
