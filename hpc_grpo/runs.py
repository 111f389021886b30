"""The run directory: its layout, its job history, and the lock that keeps one live job per run.

The run directory is the unit of state. Everything `status`, `resume` or `prune-ckpts` needs is
in it, so any command works from any login node days later. The lock is derived from the
recorded job ids and their Slurm state (not a pid file), so it holds across nodes and a dead
node cannot leave it stuck.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hpc_grpo.yamlio import SpecError

HISTORY = "history.jsonl"
SPEC = "spec.yaml"
# train: first job; requeue: a restart (note: its cause first); resume: `hpc-grpo resume`; eval: evaluation job;
# chain: a queued follow-on (cluster.restart=chain). Why a run was not carried on is a "failed" event (EVENTS).
PURPOSES = ("train", "requeue", "resume", "eval", "chain")


class RunBusy(SpecError):
    """A second submission into a run that still has a live job."""


# History lines that are not a submission: "start" is written by resume preparation at every start of a job
# (first start, requeue, resume: which checkpoint, what was quarantined); "failed" by a job that stops on an error a
# user must fix (disk full); "skipped" by an eval job queued after training that found the run not trained
# (hpc_grpo.trained). None is a job of its own: status shows them under their job.
EVENTS = ("start", "failed", "skipped")
CHECKPOINT_LOCK = ".checkpoints.lock"
DONE_FILE = "train_done.json"  # written atomically by a training that reached its last step (trl job)


@dataclass(frozen=True, slots=True)
class HistoryEntry:
    job_id: str
    purpose: str
    executor: str
    time: str
    note: str = ""
    data: dict[str, Any] = field(default_factory=dict)  # machine-readable details (events)


def append_history(run_dir: Path, job_id: str, purpose: str, executor: str, note: str = "",
                   data: dict[str, Any] | None = None) -> HistoryEntry:
    """Append one line; O_APPEND writes of one short line are atomic, so tasks on two nodes cannot interleave."""
    if purpose not in PURPOSES and purpose not in EVENTS:
        raise ValueError(f"purpose {purpose!r} is not one of {PURPOSES + EVENTS}")
    entry = HistoryEntry(str(job_id), purpose, executor, time.strftime("%Y-%m-%dT%H:%M:%S%z"), note, dict(data or {}))
    line = json.dumps(_asdict(entry)) + "\n"
    fd = os.open(run_dir / HISTORY, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)
    return entry


def _asdict(entry: HistoryEntry) -> dict[str, Any]:
    out = {f: getattr(entry, f) for f in HistoryEntry.__slots__}
    if not out["data"]:
        del out["data"]  # lines of submissions stay as they were
    return out


def read_history(run_dir: Path) -> list[HistoryEntry]:
    path = run_dir / HISTORY
    if not path.exists():
        return []
    entries = []
    for line in path.read_text().splitlines():
        if line.strip():
            data = json.loads(line)
            fields = {k: data.get(k, "") for k in HistoryEntry.__slots__ if k != "data"}
            entries.append(HistoryEntry(**fields, data=data.get("data") or {}))
    return entries


def last_job_id(run_dir: Path, purpose: str = "train") -> str | None:
    """The newest job submitted for one purpose: a training submit also queues its eval job after it."""
    ids = [e.job_id for e in read_history(run_dir) if e.purpose == purpose]
    return ids[-1] if ids else None


def job_ids(run_dir: Path) -> list[str]:
    """Distinct job ids of a run, in submission order."""
    return list(dict.fromkeys(e.job_id for e in read_history(run_dir) if e.purpose not in EVENTS))


def _pid_alive(pid: str) -> bool:
    try:
        os.kill(int(pid), 0)
    except (OSError, ValueError):
        return False
    return True


def live_jobs(run_dir: Path) -> dict[str, str]:
    """job id -> state, for every recorded job that is still queued or running."""
    history = read_history(run_dir)
    if not history:
        return {}
    history = [e for e in history if e.purpose not in EVENTS]
    slurm_ids = list(dict.fromkeys(e.job_id for e in history if e.executor == "slurm"))
    local_ids = list(dict.fromkeys(e.job_id for e in history if e.executor == "local"))
    live: dict[str, str] = {}
    if slurm_ids:
        from hpc_grpo import slurm

        for job_id, info in slurm.job_states(slurm_ids).items():
            if info.live:
                live[job_id] = info.state
    for pid in local_ids:
        if _pid_alive(pid):
            live[pid] = "RUNNING"
    return live


@contextmanager
def submit_lock(run_dir: Path) -> Iterator[None]:
    """Serialise check-then-submit on one run (two shells racing on a login node)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    with open(run_dir / ".submit.lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


@contextmanager
def checkpoint_lock(run_dir: Path, timeout_s: float = 600.0) -> Iterator[None]:
    """The run's one lock for checkpoint mutations: resume preparation (quarantine, tracker repair) and
    pruning hold it, so a prune never removes what a starting job is about to resume from.

    flock on RUN_DIR/.checkpoints.lock: held by an open file, so a killed holder never leaves it stuck.
    Raises TimeoutError after timeout_s (a stuck holder is named by the file's content: host and pid).
    """
    run_dir.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + timeout_s
    with open(run_dir / CHECKPOINT_LOCK, "a+") as handle:
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    handle.seek(0)
                    holder = handle.read().strip() or "unknown"
                    raise TimeoutError(f"{run_dir / CHECKPOINT_LOCK} is held by {holder} for more than {timeout_s:.0f} s")
                time.sleep(0.05)
        try:
            handle.seek(0)
            handle.truncate()
            handle.write(f"{os.uname().nodename} pid {os.getpid()}\n")
            handle.flush()
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def refuse_if_live(run_dir: Path) -> None:
    live = live_jobs(run_dir)
    if live:
        jobs = ", ".join(f"{j} ({s})" for j, s in live.items())
        raise RunBusy(
            f"run {run_dir.name} already has a live job: {jobs}. Wait for it, or cancel it (scancel {' '.join(live)}) "
            "before submitting into this run again",
            key="run",
        )


def wandb_run_id(run_dir: Path) -> str:
    """One W&B run id per run directory, the same for every requeue and `hpc-grpo resume` (WANDB_RUN_ID with
    WANDB_RESUME=allow), and distinct for two runs of the same name under different runs roots."""
    path = Path(run_dir)
    digest = hashlib.sha256(str(path).encode()).hexdigest()[:8]
    name = re.sub(r"[^A-Za-z0-9_-]", "_", path.name)[:55]
    return f"{name}-{digest}"


def find_runs(roots: list[Path]) -> list[Path]:
    """Run directories (those holding a spec.yaml) under the given roots, newest first."""
    found: dict[Path, float] = {}
    for root in roots:
        if root.is_dir():
            for spec in root.glob(f"*/{SPEC}"):
                found[spec.parent.resolve()] = spec.stat().st_mtime
    return sorted(found, key=found.__getitem__, reverse=True)


def run_summary(run_dir: Path) -> dict[str, Any]:
    history = [e for e in read_history(run_dir) if e.purpose not in EVENTS]
    return {"name": run_dir.name, "path": str(run_dir), "jobs": [e.job_id for e in history],
            "last_purpose": history[-1].purpose if history else None}

