"""Shared fixtures: an isolated HOME/cwd so no test writes outside its temp dir."""

from __future__ import annotations

import fcntl
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"
# The environment of every training job a test starts (Slurm or cluster=local): one OpenMP thread per process.
# The machine's 2 cores are shared by both test streams (slurm-dev's 16 CPUs are those 2 cores); torch's second
# thread gains a tiny model nothing, and under that load its spinning waits cost more CPU than the work: a trl step of
# tiny-gsm8k (4 prompts x 4) took 7-8 s with two threads, 0.8 s with one, same rewards (docs/benchmarks.md).
ONE_THREAD = {"OMP_NUM_THREADS": "1"}
# HPC_GRPO_GSM8K_DIR: where a checkout does not sit beside shared/ (a git worktree).
GSM8K_DIR = Path(os.environ.get("HPC_GRPO_GSM8K_DIR", SHARED / "data" / "gsm8k"))


@pytest.fixture(scope="session")
def probe_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One folder for the interpreter probe's answers across a session (see `isolated`)."""
    return tmp_path_factory.mktemp("python-probe")


@pytest.fixture
def isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, probe_cache: Path) -> Path:
    """HOME, cwd and caches inside tmp_path; secrets and W&B credentials removed. One cache is shared: the
    interpreter probe's (planning/python_probe: plan asks the job's venv to import verl and vLLM, 10-30 s of CPU on
    this machine), keyed by the interpreter and its packages' mtimes, as a user's ~/.cache keeps it between plans."""
    home = tmp_path / "home"
    (home / ".cache" / "hpc-grpo").mkdir(parents=True)
    (home / ".cache" / "hpc-grpo" / "python-probe").symlink_to(probe_cache, target_is_directory=True)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("USER", "user")
    monkeypatch.chdir(tmp_path)
    for var in ("WANDB_API_KEY", "HF_TOKEN", "HPC_GRPO_PATH"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("WANDB_MODE", "offline")
    return tmp_path


def tree(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


def require_verl_python(venv: Path) -> Path:
    """VENV's python (verl's environment); a failure in CI, which builds it, and a printed skip elsewhere."""
    python = venv / "bin" / "python"
    if not python.exists():
        reason = f"needs verl's environment at {venv}: build it with `bash tools/setup-env.sh verl`"
        if os.environ.get("CI") == "true":
            pytest.fail(reason, pytrace=False)
        print(f"SKIP: {reason}")
        pytest.skip(reason)
    return python


def require_gsm8k() -> Path:
    """The shared GSM8K files; a skip (with the reason printed) only off CI, where they must exist."""
    if not GSM8K_DIR.is_dir():
        if os.environ.get("CI") == "true":
            pytest.fail(f"{GSM8K_DIR} is missing: CI must have ../shared/data/gsm8k")
        reason = f"{GSM8K_DIR} is missing (the GSM8K files live in ../shared beside the checkout)"
        print(reason)
        pytest.skip(reason)
    return GSM8K_DIR


@pytest.fixture
def gsm8k_dir() -> Path:
    return require_gsm8k()


def require_verl_yamls() -> Path:
    """verl's config folder (YAMLs and Hydra in this interpreter); a skip (with the reason printed) only off CI,
    where tools/setup-env.sh dev installs them."""
    from hpc_grpo.engines.verl_schema import verl_config_dir

    folder = verl_config_dir()
    if folder is None:
        reason = "verl's config YAMLs or hydra are not installed here (pip install --no-deps verl hydra-core omegaconf)"
        if os.environ.get("CI") == "true":
            pytest.fail(f"{reason}: CI must have them (tools/setup-env.sh dev)")
        print(reason)
        pytest.skip(reason)
    return folder


@pytest.fixture
def verl_yamls() -> Path:
    return require_verl_yamls()


@pytest.fixture(scope="module")
def verl_slot() -> Iterator[None]:
    """One verl training job on this machine at a time, across pytest processes: CI runs the Slurm tests beside the
    unit and local ones (tools/run-tests.sh), and two verl jobs at once (each with vLLM, Ray and its workers) exhaust
    2 cores and 24 GiB: Ray's OOM killer then kills a worker and the run hangs. Held for a module's verl tests; the
    other stream's tests without verl run meanwhile."""
    path = Path(os.environ.get("HPC_GRPO_TEST_LOCK_DIR") or tempfile.gettempdir()) / "hpc-grpo-tests-verl.lock"
    with path.open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
