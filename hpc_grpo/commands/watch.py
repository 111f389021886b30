"""Following a run while it trains: `status --watch`'s progress updates and the end of `submit --wait` /
`resume --wait` (the job's log echoed, then the run's status, its training rows and its newest evaluation)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hpc_grpo.commands.monitor import Progress, monitor
from hpc_grpo.config.spec import RunSpec
from hpc_grpo.runstate import runs

WATCH_INTERVAL_S = 5.0


def waits_by_default(spec: RunSpec) -> bool:
    """submit and resume follow the job without --wait on cluster=local: it runs in this shell's machine anyway."""
    return spec.cluster.scheduler == "local"


def progress_updates(run_dir: Path, spec: RunSpec, interval_s: float = WATCH_INTERVAL_S) -> Iterator[tuple[Progress, list[str]]]:
    """(progress, hints not given before) whenever the logged step changes (nothing while none is logged), until no
    job of the run is live."""
    last: int | None = None
    seen: set[str] = set()
    while True:
        mon = monitor(spec)
        p = mon.progress
        if p.step != last:
            last = p.step
            new = [h for h in dict.fromkeys(mon.hints) if h not in seen]
            seen.update(new)
            yield p, new
        if not runs.live_jobs(run_dir):
            return
        time.sleep(interval_s)


def job_log(submission: Any) -> Iterator[str]:
    """The submitted job's log as it grows, until submitit says the job is done."""
    from hpc_grpo.commands.logs import follow

    return follow(Path(submission.log_hint), lambda: not submission.job.done())


@dataclass
class JobEnd:
    """How a followed job ended: the run's status, its newest evaluation (if any), and whether the job succeeded."""

    status: Any  # commands.status.RunStatus
    run_dir: Path
    newest_eval: list[dict[str, Any]] = field(default_factory=list)
    ok: bool = False


def job_end(submission: Any) -> JobEnd:
    """After the job's log has ended: the run's own row for the job decides success, not submitit's state (a local
    job that raised is "FINISHED" to submitit; on Slurm the chained eval job is the newest row)."""
    from hpc_grpo.commands.eval import results_with_paths
    from hpc_grpo.commands.status import job_succeeded, run_status

    state = submission.job.state
    status = run_status(submission.run_dir)
    results = results_with_paths(submission.run_dir)
    ok = job_succeeded(submission.run_dir, submission.job_id, state)
    return JobEnd(status, Path(submission.run_dir), results[-1:], ok)


def training_rows(run_dir: Path) -> list[dict[str, Any]]:
    """Every logged training step of the run (trl's rows or verl's file-logger rows, in one vocabulary)."""
    from hpc_grpo.runstate.layout import metrics_file
    from hpc_grpo.runstate.metrics import file_rows

    return file_rows(metrics_file(run_dir))
