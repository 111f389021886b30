"""Following a run while it trains: `status --watch`'s progress updates and the end of `submit --wait` /
`resume --wait` (the job's log echoed, then the run's status, its training rows and its newest evaluation)."""

from __future__ import annotations

import re
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hpc_grpo.commands.monitor import Progress, monitor
from hpc_grpo.config.spec import RunSpec
from hpc_grpo.runstate import runs
from hpc_grpo.runstate.metrics import parse_verl_line

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


# What a console following a job shows of its log (the whole log stays in the run directory: `hpc-grpo logs`,
# or --verbose): hpc-grpo's own lines (`hpc-grpo: ...`, `[hpc-grpo trl +1.0s] ...`, also behind Ray's
# `(TaskRunner pid=N)` prefix), verl's step lines shortened, and errors with their tracebacks. Left out: verl's
# config dump, vLLM's and Ray's info and warning lines, progress bars.
_OURS = re.compile(r"(?:^|\)\s)\[?hpc-grpo\b")
_ERROR = re.compile(r"^(?:\([^)]*\)\s*)?(?:Traceback \(most recent call last\)|[\w.]*(?:Error|Exception)\b|error:|ERROR\b)")
_RAY_PREFIX = re.compile(r"^\([^)]*\)\s*")


def short_step(row: dict[str, Any]) -> str:
    """verl's step line (dozens of metrics) as the console shows it: the step, reward, KL, length, seconds."""
    shown = [f"{name} {row[key]:.4g}" for key, name in (("reward", "reward"), ("kl", "kl"),
                                                         ("response_length", "response length"))
             if isinstance(row.get(key), float)]
    took = f" ({row['step_time']:.1f} s)" if isinstance(row.get("step_time"), float) else ""
    return f"hpc-grpo: verl step {row['step']}: " + ", ".join(shown) + took


def console_lines(chunks: Iterable[str]) -> Iterator[str]:
    """The lines of a job's log a console following it shows (see _OURS above), as they complete."""
    pending = ""
    in_traceback = False
    for chunk in chunks:
        pending += chunk
        *lines, pending = pending.split("\n")
        for raw in lines:
            line = raw.rsplit("\r", 1)[-1]  # a progress bar redraws with \r: its last state
            body = _RAY_PREFIX.sub("", line)
            if in_traceback:
                yield line + "\n"
                in_traceback = body.startswith((" ", "\t", "Traceback")) or not body.strip()
                continue
            if _OURS.search(line):
                yield line + "\n"
            elif (row := parse_verl_line(line)) is not None:
                yield short_step(row) + "\n"
            elif _ERROR.match(line):
                in_traceback = body.startswith("Traceback")
                yield line + "\n"
    if pending.strip() and (_OURS.search(pending) or _ERROR.match(pending)):
        yield pending + "\n"


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
