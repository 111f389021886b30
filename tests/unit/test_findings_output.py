"""Off a terminal (pipes, CI logs) findings print as whole lines, never folded at 80 columns."""

from __future__ import annotations

import os
import subprocess
import sys

LONG_KEY = "passthrough.actor_rollout_ref.actor.megatron.override_transformer_config.fp16_lm_cross_entropy"


def test_findings_are_whole_lines_in_a_pipe(tmp_path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "hpc_grpo.cli.app", "plan", "recipe=qwen2.5-7b-codegen", "cluster=a100-ib",
         "cluster.runs_root=/nonexistent/runs", "--no-schema", "checkpoint.save_freq=500",
         LONG_KEY.removeprefix("passthrough.") + "=True"],
        capture_output=True, text=True, timeout=120,
        env={**os.environ, "HOME": str(tmp_path), "COLUMNS": "80", "TERM": "xterm"},
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    wrong = [ln for ln in lines if f"error: {LONG_KEY}: " in ln]
    assert wrong and "Fix: nothing to set: follows actor_rollout_ref.actor.megatron.dtype" in wrong[0]  # one line
    save = [ln for ln in lines if ln.startswith("  warning: checkpoint.save_freq: ")]
    assert save and "Fix: use checkpoint.save_freq=" in save[0] and len(save[0]) > 80
    assert not any(ln.startswith(("┃", "│", "┏")) for ln in lines[lines.index("Findings:"):])
