"""The MATH boxed-answer reward end to end on cluster=local (no Slurm), on the 30 shipped problems
(`hpc-grpo data math`) and the tiny random model: trl's GRPOTrainer for a few steps with the reward called on its
completions and the evaluation through lm-eval's MATH task. A random model rarely boxes anything, so this proves
the path, not learning. verl's real main_ppo on the same reward (loaded by its pkg:// path) shares a run with the
dead-engine test: tests/local/test_verl_local.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import ONE_THREAD

REPO = Path(__file__).resolve().parents[2]


def submit(tmp_path: Path, recipe: str, *overrides: str) -> Path:
    """`hpc-grpo data math`, the tiny model, and `submit ... cluster=local --wait`; the run directory."""
    from hpc_grpo.data.math import SHIPPED_PROBLEMS, prepare_math
    from hpc_grpo.data.tiny_model import ensure_tiny_model

    model = ensure_tiny_model(tmp_path / "models" / "tiny-qwen2")
    data = prepare_math(SHIPPED_PROBLEMS, tmp_path / "data")
    files = (data.trl_train, data.trl_test)
    drop = {"WANDB_API_KEY", "HF_TOKEN", "HPC_GRPO_PATH", "RAY_ADDRESS", "RAY_AUTH_MODE", "VIRTUAL_ENV",
            "SLURM_JOB_ID", "SLURM_CONF"}
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env.update(HOME=str(tmp_path / "home"), WANDB_MODE="offline", HF_HUB_OFFLINE="1", PYTHONPATH=str(REPO), **ONE_THREAD)
    argv = [sys.executable, "-m", "hpc_grpo.cli.app", "submit", f"recipe={recipe}", "cluster=local",
            f"cluster.runs_root={tmp_path / 'runs'}", f"model.path={model}", f"data.train_files={files[0]}",
            f"data.val_files={files[1]}", *overrides, "--name", "math", "--wait"]
    proc = subprocess.run(argv, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=900,
                          stdin=subprocess.DEVNULL, check=False)
    run = tmp_path / "runs" / "math"
    logs = "\n".join(p.read_text(errors="replace")[-4000:] for p in sorted((run / "submitit").glob("*_log.*")))
    assert proc.returncode == 0, (proc.stdout[-3000:], proc.stderr[-3000:], logs)
    return run


def test_trl_trains_on_the_math_reward_and_lm_eval_scores_math(tmp_path: Path) -> None:
    run = submit(tmp_path, "tiny-math", "train.total_training_steps=3", "checkpoint.save_freq=3")
    state = json.loads((run / "checkpoints" / "checkpoint-3" / "trainer_state.json").read_text())
    steps = [row for row in state["log_history"] if "rewards/math_boxed/mean" in row]
    assert len(steps) == 3, state["log_history"]  # trl called the registry's math_boxed on every step's completions
    assert all(0.0 <= row["rewards/math_boxed/mean"] <= 1.0 for row in steps)
    result = json.loads((run / "eval" / "step_3.json").read_text())
    math = result["scores"]["math"]  # lm-eval's hendrycks_math on the prepared rows, our boxed reward beside it
    assert math["n"] == 4 and 0.0 <= math["exact_match"] <= 1.0 and 0.0 <= math["boxed_reward"] <= 1.0
    assert all(s["completion"] and s["target"] for s in math["samples"])
    assert "hpc_grpo_math" in " ".join(result["lm_eval_cli"])
