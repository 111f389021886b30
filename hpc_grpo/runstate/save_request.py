"""The save-on-signal handshake, as files in the run directory: the job callable (hpc_grpo.launch.submit.TrainJob)
writes `save_request` for the training process of this attempt (named by HPC_GRPO_ATTEMPT, which TrainJob sets for
its child), the training process (hpc_grpo.job.save_signal) saves and records the step in `signal_save.json`, then
exits with STOPPED_FOR_REQUEUE. Both sides and tools/bench_faults.py read the names here, so neither imports the
other's package."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from hpc_grpo.common.atomic import write_text_atomic
from hpc_grpo.runstate import layout

ATTEMPT_ENV = "HPC_GRPO_ATTEMPT"
# Exit status of a training process that stopped after a save on the signal (EX_TEMPFAIL: "try again").
STOPPED_FOR_REQUEUE = 75


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def read_marker(run_dir: Path) -> dict[str, Any] | None:
    """The save the training process recorded (step, checkpoint, pid), or None."""
    return _read_json(layout.save_marker(run_dir))


def write_marker(run_dir: Path, data: dict[str, Any]) -> None:
    """Record the save (atomically: TrainJob polls this file)."""
    write_text_atomic(layout.save_marker(run_dir), json.dumps(data) + "\n")


def read_request(run_dir: Path) -> dict[str, Any] | None:
    return _read_json(layout.save_request(run_dir))


def write_request(run_dir: Path, attempt: str) -> None:
    """Ask the training process of `attempt` to save at its next step end (atomic: it polls the file)."""
    write_text_atomic(layout.save_request(run_dir), json.dumps({"attempt": attempt, "time": time.time()}) + "\n")
