"""train.early_stop for real (cluster=local, the tiny trl recipe, shrunk): the job validates every 2 steps on 4
validation prompts and, with a min_delta no reward can beat (rewards lie in [0, 1]), stops at the second
validation (step 4 of 20), saves there, records why, counts as trained, and its evaluation runs on that step.
Through the product's front door: `hpc-grpo submit ... --wait`, then `hpc-grpo status --json`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from hpc_grpo.runstate import runs
from tests.conftest import ONE_THREAD, require_gsm8k

STEPS, FREQ = 20, 2
SHRINK = [f"train.total_training_steps={STEPS}", "checkpoint.save_freq=10", "batch.train=2", "batch.mini=2",
          "batch.micro_per_gpu=4", "batch.log_prob_micro_per_gpu=4", "grpo.n=2", "data.max_response_length=8",
          "eval.limit=2"]
EARLY = [f"train.test_freq={FREQ}", "train.early_stop.metric=eval_reward", "train.early_stop.patience=1",
         "train.early_stop.min_delta=1.0", "train.early_stop.val_rows=4"]


def test_plateau_stops_saves_is_trained_and_evaluated(tmp_path: Path) -> None:
    from hpc_grpo.data.gsm8k import prepare_gsm8k
    from hpc_grpo.data.tiny_model import ensure_tiny_model

    model = ensure_tiny_model(tmp_path / "models" / "tiny-qwen2")
    data = prepare_gsm8k(require_gsm8k(), tmp_path / "data")
    env = {k: v for k, v in os.environ.items() if k not in {"WANDB_API_KEY", "HF_TOKEN", "HPC_GRPO_PATH",
                                                             "SLURM_JOB_ID", "SLURM_CONF"}}
    env.update(HOME=str(tmp_path), WANDB_MODE="offline", HF_HUB_OFFLINE="1", **ONE_THREAD)
    cli = [sys.executable, "-m", "hpc_grpo.cli.app"]
    t0 = time.monotonic()
    proc = subprocess.run([*cli, "submit", "recipe=tiny-gsm8k", "cluster=local", f"cluster.runs_root={tmp_path / 'runs'}",
                           f"model.path={model}", f"data.train_files={data.trl_train}", f"data.val_files={data.trl_test}",
                           *SHRINK, *EARLY, "--name", "plateau", "--wait"],
                          env=env, cwd=tmp_path, capture_output=True, text=True, timeout=900, stdin=subprocess.DEVNULL,
                          check=False)
    run = tmp_path / "runs" / "plateau"
    log = "".join(p.read_text(errors="replace") for p in sorted((run / "submitit").glob("*_log.out")))
    assert proc.returncode == 0, (proc.stdout[-3000:], proc.stderr[-3000:], log[-4000:])
    print(f"\nearly stop run with its evaluation: {time.monotonic() - t0:.0f} s")

    done = json.loads((run / "train_done.json").read_text())
    assert done["final_step"] == 2 * FREQ and done["max_steps"] == STEPS
    early = done["early_stop"]
    assert early["best_step"] == FREQ and early["stopped_at"] == 2 * FREQ and [s for s, _ in early["values"]] == [2, 4]
    assert early["reason"].startswith("early stop at step 4: eval_reward did not improve by more than 1")
    assert Path(done["last_checkpoint"]).name == "checkpoint-4"  # saved at the plateau, not at a save_freq step
    (stopped,) = [e for e in runs.read_history(run) if e.purpose == "stopped"]
    assert stopped.note == early["reason"]
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "eval_reward" in r] == [2, 4]
    assert max(r["step"] for r in rows) == 4  # not one step past the plateau
    assert (run / "eval" / "step_4.json").is_file(), log[-3000:]  # the evaluation after training ran on it

    status = subprocess.run([*cli, "status", str(run), "--json"], env=env, cwd=tmp_path, capture_output=True,
                            text=True, timeout=120, check=True)
    trained = json.loads(status.stdout)["trained"]
    assert trained.startswith("trained (train_done.json: step 4; early stop at step 4"), trained
