"""`hpc-grpo logs` and the log echo of `submit --wait` / `resume --wait`: which log, and what it gains while its
job runs. One follow loop serves both, so both end the same way (one last read after the job has ended)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from hpc_grpo.common.yamlio import SpecError
from hpc_grpo.commands.monitor import log_path, newest_job
from hpc_grpo.runstate import layout, runs

POLL_S = 1.0  # how often the log is read again while following
LIVE_CHECK_S = 5.0  # how often `logs -f` asks Slurm whether the job still lives (squeue is not free)


@dataclass(frozen=True)
class LogChoice:
    """The log `hpc-grpo logs` shows: whose run, which job, which file."""

    run_dir: Path
    job: str
    path: Path


def choose_log(run: str | None, job: str | None, node: int, stderr: bool) -> LogChoice:
    """The log of node `node` of `job` (default: the run's newest job); SpecError (exit 2) for a run without a job
    or a node outside the run."""
    from hpc_grpo.commands.status import locate_run
    from hpc_grpo.config.resolve import load_frozen

    run_dir = locate_run(run)
    spec = load_frozen(layout.spec_file(run_dir))
    job = job or newest_job(run_dir)
    if job is None:
        raise SpecError(f"run {run_dir.name} has no job yet", key="run")
    if node < 0 or node >= spec.recipe.resources.nodes:
        raise SpecError(f"--node {node}: the run has nodes 0..{spec.recipe.resources.nodes - 1}", key="--node")
    return LogChoice(run_dir, job, log_path(spec, job, node, stderr))


def read_from(path: Path, pos: int) -> tuple[str, int]:
    """What a log gained since byte `pos`, and the new end ("" and `pos` while the file does not exist)."""
    if not path.is_file():
        return "", pos
    with open(path, errors="replace") as handle:
        handle.seek(pos)
        chunk = handle.read()
        return chunk, handle.tell()


def follow(path: Path, running: Callable[[], bool] | None, poll_s: float = POLL_S,
           check_every_s: float = 0.0) -> Iterator[str]:
    """Yield what the log gains, from its start, until `running()` says the job has ended; then one last read picks
    up its final lines. `running` None: read once. `running` is asked at most every `check_every_s`."""
    pos, next_check = 0, 0.0
    while True:
        chunk, pos = read_from(path, pos)
        if chunk:
            yield chunk
        if running is None:
            return
        if time.monotonic() >= next_check:
            if not running():
                running = None
                continue
            next_check = time.monotonic() + check_every_s
        time.sleep(poll_s)


def job_log(choice: LogChoice, keep_following: bool) -> Iterator[str]:
    """`hpc-grpo logs [-f]`: the log once, or followed while the job is queued or running."""
    def live() -> bool:
        return choice.job in runs.live_jobs(choice.run_dir)

    return follow(choice.path, live if keep_following else None, check_every_s=LIVE_CHECK_S)
