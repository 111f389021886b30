"""Save on the signal: USR2 (time-limit warning, preemption, `scancel --signal=USR2`) -> a checkpoint at the next
step boundary, then the training process stops so the job can be requeued with nothing lost.

Slurm signals every process of the step (proctrack), and submitit's TrainJob.checkpoint() forwards USR2 once more;
either way this process only sets a flag (the default action of USR2 would kill it mid-step). A TrainerCallback
reads the flag at each step end and asks the trainer to save and stop. SIGTERM (the time limit itself, preemption
after its grace time, `scontrol requeue`) is held off while a save is pending, so the checkpoint being written is
not torn; without a pending save SIGTERM ends the process as it always did (resume then comes from disk).

A second channel covers a signal that comes while the process is still starting (the launch script ignores USR2
until this process installs its handler): TrainJob writes `save_request` into the run directory, holding this
attempt's key (HPC_GRPO_ATTEMPT, set by TrainJob for its child), and the callback reads it at every step end. A
request of an earlier attempt (another key) is ignored. Every attempt still trains at least one step before it
stops, so a run whose signal always comes early still moves on.

When the save is done, `signal_save.json` in the run directory says which step it holds: TrainJob.checkpoint()
and tools/bench_faults.py read it. The file names, the attempt variable and the exit status are the handshake in
hpc_grpo.runstate.save_request.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

from hpc_grpo.runstate import save_request


class SaveOnSignal:
    """The flag and its handlers; one per training process."""

    def __init__(self, run_dir: Path | None = None, attempt: str | None = None) -> None:
        self.requested_at: float | None = None  # time.time() of the first USR2 (or of the request file)
        self.saving = False
        self.saved_step: int | None = None
        self.held_sigterm = 0
        self.run_dir = run_dir
        self.attempt = attempt if attempt is not None else os.environ.get(save_request.ATTEMPT_ENV)

    @property
    def requested(self) -> bool:
        if self.requested_at is None and self.run_dir is not None and self.attempt:
            request = save_request.read_request(self.run_dir)
            if request and request.get("attempt") == self.attempt:
                self.requested_at = float(request.get("time") or time.time())
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
        save_request.write_marker(run_dir, data)
        return data


def callback(flag: SaveOnSignal) -> Any:
    """A TrainerCallback: when the flag is set, save at this step's end and stop training."""
    from transformers import TrainerCallback

    class SaveOnSignalCallback(TrainerCallback):
        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
            if flag.requested:
                flag.saving = True
                control.should_save = True
                control.should_training_stop = True
            return control

    return SaveOnSignalCallback()
