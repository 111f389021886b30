"""On slurm-dev, a verl job whose interpreter cannot run verl is never queued.

1. A profile venv without verl (`cluster.setup.venv=<a bare venv>`): submit exits 1 naming the interpreter, the
   missing module and the fix; no run directory, and Slurm has no job of that name.
2. No interpreter set up, submitted from an interpreter that cannot run verl (the quickstart's `.venv`): the job is
   given the checkout's `.venv-verl` (its sbatch script activates it; `--dry-run` queues nothing), or, without a
   `.venv-verl` that imports verl's trainer, it is refused with `bash tools/setup-env.sh verl`.
"""

from __future__ import annotations

import subprocess
import sys
import venv
from pathlib import Path

import pytest

from tests.slurm.test_submit import GSM8K, REPO, Env, make_env

pytestmark = [pytest.mark.slurm, pytest.mark.usefixtures("slurm_cluster")]

VERL_VENV = REPO / ".venv-verl"


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Env:
    from hpc_grpo.data.gsm8k import prepare_gsm8k

    e = make_env(tmp_path_factory.mktemp("interp"))
    data = prepare_gsm8k(GSM8K, e.root / "data")
    e.tiny = ["recipe=tiny-verl", "resources.nodes=2", f"data.train_files={data.verl_train}",
              f"data.val_files={data.verl_test}", f"model.path={e.root / 'models' / 'tiny-qwen2'}",
              "eval.enabled=false"]
    return e


def imports_verl(python: Path | str) -> bool:
    return subprocess.run([str(python), "-c", "import verl.trainer.main_ppo, ray"], capture_output=True, timeout=600,
                          check=False).returncode == 0


def queued_names() -> str:
    return subprocess.run(["squeue", "-h", "-o", "%j"], capture_output=True, text=True, check=False).stdout


def test_a_venv_without_verl_is_refused_and_nothing_is_queued(env: Env) -> None:
    bare = env.root / "bare-venv"
    venv.create(bare, with_pip=False)
    name = env.name("interp-bare")
    proc = env.submit(*env.tiny, f"cluster.setup.venv={bare}", "--name", name, timeout=600)
    text = " ".join((proc.stdout + proc.stderr).split())
    assert proc.returncode == 1, text
    assert f"the job's interpreter {bare}/bin/python cannot import" in text and "is missing" in text, text
    assert "bash tools/setup-env.sh verl" in text and "Nothing submitted" in text
    assert not (env.runs_root / name).exists()
    assert name not in queued_names()


def test_the_submitting_venv_without_verl_gets_the_checkout_venv_or_a_refusal(env: Env) -> None:
    if imports_verl(sys.executable):
        pytest.skip(f"{sys.executable} runs verl itself: nothing to fall back from")
    name = env.name("interp-fallback")
    proc = env.submit(*env.tiny, "--name", name, "--dry-run", timeout=600)
    text = " ".join((proc.stdout + proc.stderr).split())
    if (VERL_VENV / "bin" / "python").exists() and imports_verl(VERL_VENV / "bin" / "python"):
        assert proc.returncode == 0, text
        assert f"python: {VERL_VENV}/bin/python (the checkout's .venv-verl: the submitting interpreter " \
               f"{sys.executable} cannot import" in text, text
        assert f"source {VERL_VENV}/bin/activate" in proc.stdout  # the sbatch script it would queue
    else:
        assert proc.returncode == 1 and "bash tools/setup-env.sh verl" in text, text
    assert not (env.runs_root / name).exists() and name not in queued_names()
