"""Save on the signal: USR2 (time-limit warning, preemption, `scancel --signal=USR2`) -> a checkpoint at the next
step boundary, then the training process stops so the job can be requeued with nothing lost.

Slurm signals every process of the step (proctrack), and submitit's TrainJob.checkpoint() forwards USR2 once more;
either way this process only sets a flag (the default action of USR2 would kill it mid-step). A TrainerCallback
reads the flag at each step end and asks the trainer to save and stop. SIGTERM (the time limit itself, preemption
after its grace time, `scontrol requeue`) is held off while a save is pending, so the checkpoint being written is
not torn; without a pending save SIGTERM ends the process as it always did (resume then comes from disk).

When the save is done, `signal_save.json` in the run directory says which step it holds: TrainJob.checkpoint()
and tools/bench_faults.py read it.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any

MARKER = "signal_save.json"
# Exit status of a training process that stopped after a save on the signal (EX_TEMPFAIL: "try again").
STOPPED_FOR_REQUEUE = 75


class SaveOnSignal:
    """The flag and its handlers; one per training process."""

    def __init__(self) -> None:
        self.requested_at: float | None = None  # time.time() of the first USR2
        self.saving = False
        self.saved_step: int | None = None
        self.held_sigterm = 0

    @property
    def requested(self) -> bool:
        return self.requested_at is not None

    def install(self) -> None:
        """Install the USR2 and SIGTERM handlers (main thread; as early as possible in the process)."""
        signal.signal(signal.SIGUSR2, self._on_usr2)
        signal.signal(signal.SIGTERM, self._on_term)

    def _on_usr2(self, signum: int, frame: Any) -> None:
        if self.requested_at is None:
            self.requested_at = time.time()
            print("[hpc-grpo] USR2: saving at the next step boundary, then stopping for the requeue", flush=True)

    def _on_term(self, signum: int, frame: Any) -> None:
        if self.requested and self.saved_step is None:
            self.held_sigterm += 1
            print("[hpc-grpo] SIGTERM held off: a save on the signal is pending", flush=True)
            return
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)

    def write_marker(self, run_dir: Path, step: int, checkpoint: str | None) -> dict[str, Any]:
        """Record the save (atomically: readers poll this file)."""
        self.saved_step = step
        data = {"step": step, "checkpoint": checkpoint, "signal_at": self.requested_at, "saved_at": time.time(),
                "pid": os.getpid(), "held_sigterm": self.held_sigterm}
        tmp = run_dir / f".{MARKER}.{os.getpid()}.tmp"
        tmp.write_text(json.dumps(data) + "\n", encoding="utf-8")
        os.replace(tmp, run_dir / MARKER)
        return data


def read_marker(run_dir: Path) -> dict[str, Any] | None:
    try:
        data = json.loads((run_dir / MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def callback(state: SaveOnSignal) -> Any:
    """A TrainerCallback: when the flag is set, save at this step's end and stop training."""
    from transformers import TrainerCallback

    class SaveOnSignalCallback(TrainerCallback):
        def on_step_end(self, args: Any, tstate: Any, control: Any, **kw: Any) -> Any:
            if state.requested:
                state.saving = True
                control.should_save = True
                control.should_training_stop = True
            return control

    return SaveOnSignalCallback()
