"""The README's tiny-verl command, typed as it reads, from the quickstart's `.venv` (issue 27).

`.venv`'s hpc-grpo has verl's config files but not its trainer. Before, `submit recipe=tiny-verl cluster=local` passed
plan, queued, and the job died 6 s in on `No module named 'codetiming'`. Now the job either trains, on the checkout's
`.venv-verl` (built by `bash tools/setup-env.sh verl`, which the README says to run first), or is refused before
anything is queued, naming the interpreter, the missing module and that fix. Which one is decided here from whether
the checkout has a `.venv-verl` that imports verl's trainer, so a wrong turn either way fails.

Only the data and model overrides tests/local/test_verl_local.py uses are added (no `cluster.setup.venv`). The job
runs this checkout's hpc_grpo (PYTHONPATH). Skipped without `.venv`; a few minutes on 2 cores when it trains.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DEV_CLI = REPO / ".venv" / "bin" / "hpc-grpo"
VERL_PYTHON = REPO / ".venv-verl" / "bin" / "python"
GSM8K = REPO.parent / "shared" / "data" / "gsm8k"


def verl_venv_works() -> bool:
    """The checkout's .venv-verl imports verl's trainer (what the job runs)."""
    if not VERL_PYTHON.exists():
        return False
    return subprocess.run([str(VERL_PYTHON), "-c", "import verl.trainer.main_ppo"], capture_output=True,
                          timeout=600, check=False).returncode == 0


def test_readme_tiny_verl_trains_or_is_refused_before_queueing(tmp_path: Path) -> None:
    if not DEV_CLI.exists():
        pytest.skip(f"needs the quickstart's {DEV_CLI} (bash tools/setup-env.sh dev)")
    from hpc_grpo.data.gsm8k import prepare_gsm8k
    from hpc_grpo.data.tiny_model import ensure_tiny_model

    model = ensure_tiny_model(tmp_path / "models" / "tiny-qwen2")
    data = prepare_gsm8k(GSM8K, tmp_path / "data")
    home = tmp_path / "home"
    home.mkdir()
    drop = {"WANDB_API_KEY", "HF_TOKEN", "HPC_GRPO_PATH", "RAY_ADDRESS", "VIRTUAL_ENV", "SLURM_JOB_ID", "SLURM_CONF",
            "XDG_CACHE_HOME"}
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env.update(HOME=str(home), WANDB_MODE="offline", HF_HUB_OFFLINE="1", PYTHONPATH=str(REPO))
    trains = verl_venv_works()
    argv = [str(DEV_CLI), "submit", "recipe=tiny-verl", "cluster=local", f"cluster.runs_root={tmp_path / 'runs'}",
            f"model.path={model}", f"data.train_files={data.verl_train}", f"data.val_files={data.verl_test}",
            "train.total_training_steps=2", "eval.enabled=false", "--name", "tv", "--wait"]
    proc = subprocess.run(argv, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=1500,
                          stdin=subprocess.DEVNULL, check=False)
    text = " ".join((proc.stdout + proc.stderr).split())
    run = tmp_path / "runs" / "tv"
    if not trains:
        assert proc.returncode == 1, text[-3000:]
        assert "cannot import" in text and "is missing" in text and "bash tools/setup-env.sh verl" in text, text
        assert "Nothing submitted" in text and not (tmp_path / "runs").exists()
        return
    logs = "\n".join(p.read_text(errors="replace") for p in sorted((run / "submitit").glob("*_log.*")))
    assert proc.returncode == 0, (text[-3000:], logs[-6000:])
    # the job ran the checkout's .venv-verl, as plan said, and trained both steps
    spec_text = (run / "spec.yaml").read_text()
    assert f"python: {VERL_PYTHON}" in spec_text, spec_text[-400:]
    assert f"python: {VERL_PYTHON} (the checkout's .venv-verl: the submitting interpreter" in text, text[:2000]
    ckpts = run / "checkpoints"
    assert (ckpts / "global_step_2").is_dir(), sorted(os.listdir(ckpts))
    assert (ckpts / "latest_checkpointed_iteration.txt").read_text().strip() == "2"
