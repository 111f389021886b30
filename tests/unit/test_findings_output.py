"""Issue 8, fault 9: off a terminal (pipes, CI logs) findings print as whole lines, never folded at 80 columns."""

from __future__ import annotations

import os
import subprocess
import sys

LONG_KEY = "passthrough.actor_rollout_ref.actor.megatron.override_transformer_config.recompute_granularity"


def test_findings_are_whole_lines_in_a_pipe(tmp_path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "hpc_grpo.cli.app", "plan", "recipe=qwen2.5-7b-codegen", "cluster=a100-ib",
         "cluster.runs_root=/nonexistent/runs", "--no-schema", "checkpoint.save_freq=500",
         LONG_KEY.removeprefix("passthrough.") + "=selective"],
        capture_output=True, text=True, timeout=120,
        env={**os.environ, "HOME": str(tmp_path), "COLUMNS": "80", "TERM": "xterm"},
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    owned = [ln for ln in lines if f"error: {LONG_KEY}: " in ln]
    assert owned and "Fix: set model.gradient_checkpointing instead" in owned[0]  # key, message and fix on one line
    save = [ln for ln in lines if ln.startswith("  warning: checkpoint.save_freq: ")]
    assert save and "Fix: use checkpoint.save_freq=" in save[0] and len(save[0]) > 80
    assert not any(ln.startswith(("┃", "│", "┏")) for ln in lines[lines.index("Findings:"):])
