"""A run directory's job history and its locks: the lease lock that keeps one live job per run (file names: layout).

The run directory is the unit of state. Everything `status`, `resume` or `prune-ckpts` needs is
in it, so any command works from any login node days later. The lock is derived from the
recorded job ids and their Slurm state (not a pid file), so it holds across nodes and a dead
node cannot leave it stuck.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import socket
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator, MutableMapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hpc_grpo.common import procstat
from hpc_grpo.common.yamlio import SpecError
from hpc_grpo.runstate import layout

# train: first job; requeue: a restart (note: its cause first); resume: `hpc-grpo resume`; eval: evaluation job;
# chain: a queued follow-on (cluster.restart=chain). Why a run was not carried on is a "failed" event (EVENTS).
PURPOSES = ("train", "requeue", "resume", "eval", "chain")


class RunBusy(SpecError):
    """A second submission into a run that still has a live job."""


# History lines that are not a submission: "start" is written by resume preparation at every start of a job
# (first start, requeue, resume: which checkpoint, what was quarantined); "failed" by a job that stops on an error a
# user must fix (disk full); "skipped" by an eval job queued after training that found the run not trained
# (hpc_grpo.runstate.trained); "stopped" by a training that ended before its last step on purpose (train.early_stop:
# a validation plateau), the run then trained. None is a job of its own: status shows them under their job.
EVENTS = ("start", "failed", "skipped", "stopped")


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
    fd = os.open(layout.history_file(run_dir), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
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
    path = layout.history_file(run_dir)
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
    """A local job (its controller's PID) still runs. A zombie does not: once the submitting command has exited,
    the controller's parent is PID 1, which may reap it only later (measured: a resume right after the job ended
    was refused as 'live')."""
    try:
        os.kill(int(pid), 0)
    except PermissionError:
        return True  # alive, another user's
    except (OSError, ValueError):
        return False
    return not procstat.ended(int(pid))


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
        from hpc_grpo.cluster import slurm

        for job_id, info in slurm.job_states(slurm_ids).items():
            if info.live:
                live[job_id] = info.state
    for pid in local_ids:
        if _pid_alive(pid):
            live[pid] = "RUNNING"
    return live


@contextmanager
def submit_lock(run_dir: Path, timeout_s: float = 600.0) -> Iterator[None]:
    """Serialise check-then-submit on one run (two shells racing on login nodes): the same lease lock as the
    checkpoint lock, on its own file, so it holds where flock does not (Lustre without flock, some NFS)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    with lease_lock(layout.submit_lock(run_dir), timeout_s):
        yield


# The checkpoint lock's lease: a holder rewrites its expiry every LEASE_S / 4 while it holds the lock, so a record
# whose expiry passed belongs to a holder that is gone (or cut off) on another node. Generous against clock skew.
LEASE_S = 120.0
_HOST = socket.gethostname()


@dataclass(frozen=True, slots=True)
class LockHolder:
    """What a checkpoint lock file says about its holder. `ident` is the token, or for a record that cannot be
    parsed (being written, or not written by hpc-grpo) the file's inode and mtime."""

    host: str
    pid: int
    ident: str
    expires: float

    def stale(self, now: float) -> bool:
        """Gone: on this host the pid decides (a live pid is a holder, even one too busy to refresh); elsewhere,
        where no pid can be asked, an expired lease."""
        if self.host == _HOST and self.pid > 0:
            return not _pid_alive(str(self.pid))
        return now > self.expires

    def __str__(self) -> str:
        return f"{self.host or 'unknown host'} pid {self.pid or '?'}"


def _read_holder(path: Path) -> LockHolder:
    """The record in a lock file; raises FileNotFoundError when it is gone."""
    st = os.stat(path)
    text = path.read_bytes().decode(errors="replace")
    try:
        rec = json.loads(text)
        return LockHolder(str(rec["host"]), int(rec["pid"]), str(rec["token"]), float(rec["expires"]))
    except (ValueError, KeyError, TypeError):
        # a record being written, or not ours: a holder of no known host until its file is a lease old
        return LockHolder("", 0, f"inode {st.st_ino} mtime {st.st_mtime_ns}", st.st_mtime + LEASE_S)


def _record(token: str) -> bytes:
    return json.dumps({"host": _HOST, "pid": os.getpid(), "token": token, "expires": time.time() + LEASE_S}).encode()


def _write_record(fd: int, token: str) -> None:
    """Rewrite the holder's own file through its descriptor: never another holder's, even after a takeover."""
    data = _record(token)
    os.ftruncate(fd, 0)
    os.pwrite(fd, data, 0)
    os.fsync(fd)  # NFS: the new expiry reaches the server, where waiters on other nodes read it


def _still_stale(ident: str) -> Callable[[LockHolder], bool]:
    """The judge for _remove_if: the same holder as seen before, and still stale now."""
    return lambda h: h.ident == ident and h.stale(time.time())


def _remove_if(path: Path, judge: Callable[[LockHolder], bool]) -> bool:
    """Remove the lock file if its holder passes `judge`. The file is renamed aside first (rename is atomic on
    NFS and Lustre, so of two callers only one moves it) and judged there, so the judgement and the removal
    concern one file, never a lock someone created meanwhile; a file that fails the judgement is put back.
    Returns whether it was removed."""
    try:
        if not judge(_read_holder(path)):
            return False  # not even moved: the common case of a lock that passed to someone else
    except FileNotFoundError:
        return False
    aside = path.with_name(f"{path.name}.{uuid.uuid4().hex}.aside")
    try:
        os.rename(path, aside)
    except FileNotFoundError:
        return False
    try:
        if judge(_read_holder(aside)):
            return True
        try:
            os.link(aside, path)  # back where it was, unless a new lock was created in the moment it was away
        except FileExistsError:
            pass
        except OSError:  # a filesystem without hard links
            os.rename(aside, path)
        return False
    finally:
        aside.unlink(missing_ok=True)


@contextmanager
def checkpoint_lock(run_dir: Path, timeout_s: float = 600.0) -> Iterator[None]:
    """The run's one lock for checkpoint mutations: resume preparation (quarantine, tracker repair), saves,
    pruning and reader leases hold it, so a prune never removes what a starting job is about to resume from."""
    run_dir.mkdir(parents=True, exist_ok=True)
    with lease_lock(layout.checkpoint_lock(run_dir), timeout_s):
        yield


@contextmanager
def lease_lock(path: Path, timeout_s: float = 600.0) -> Iterator[None]:
    """A lock file that holds across nodes of a shared filesystem (the checkpoint lock, the submit lock).

    The file, e.g. RUN_DIR/.checkpoints.lock, is created with O_CREAT|O_EXCL (atomic on local disks, NFSv3+ and
    Lustre) and holding host, pid, a token and a lease expiry that a thread refreshes while the lock is held.
    No flock: Lustre mounted without it and some NFS setups refuse it (ENOLCK) or lock within one node only,
    while prune, resume preparation and saves run on different nodes; a second, flock-based path would only
    add a mode whose exclusion differs by mount. A waiter takes over a dead holder's file (this host, pid gone)
    or an expired lease (another host) through _remove_if, then competes for O_EXCL like any other waiter, so
    two waiters never both win. Release removes the file only while it still holds this holder's token.
    Raises TimeoutError after timeout_s, naming the holder (host and pid).
    """
    token = uuid.uuid4().hex
    deadline = time.monotonic() + timeout_s
    pause = 0.02
    while True:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
            break
        except FileExistsError:
            pass
        try:
            holder = _read_holder(path)
        except FileNotFoundError:
            continue  # released meanwhile: try again at once
        if holder.stale(time.time()) and _remove_if(path, _still_stale(holder.ident)):
            continue  # taken away from a gone holder: now compete for O_EXCL
        if time.monotonic() >= deadline:
            raise TimeoutError(f"{path} is held by {holder} for more than {timeout_s:.0f} s (a holder on another "
                               f"host counts as gone {LEASE_S:.0f} s after its last lease refresh)")
        time.sleep(pause)
        pause = min(pause * 1.5, 0.5)
    stop = threading.Event()
    refresher = threading.Thread(target=_refresh, args=(fd, token, stop), name="checkpoint-lock-lease", daemon=True)
    try:
        _write_record(fd, token)
        refresher.start()
        yield
    finally:
        stop.set()
        if refresher.is_alive():
            refresher.join()
        os.close(fd)
        _remove_if(path, lambda h: h.ident == token)


def _refresh(fd: int, token: str, stop: threading.Event) -> None:
    """Keep the lease of a held lock fresh, so waiters on other hosts see a live holder however long it holds."""
    while not stop.wait(LEASE_S / 4):
        try:
            _write_record(fd, token)
        except OSError as exc:  # the next refresh may succeed; the lease covers a few missed ones
            print(f"hpc-grpo: checkpoint lock lease refresh failed: {exc}", file=sys.stderr, flush=True)


def refuse_if_live(run_dir: Path) -> None:
    live = live_jobs(run_dir)
    if live:
        jobs = ", ".join(f"{j} ({s})" for j, s in live.items())
        raise RunBusy(
            f"run {run_dir.name} already has a live job: {jobs}. Wait for it, or cancel it (scancel {' '.join(live)}) "
            "before submitting into this run again",
            key="run",
        )


def drop_inherited_wandb_service(env: MutableMapping[str, str]) -> None:
    """A job starts W&B's service of its own. wandb puts its service token (WANDB_SERVICE) into the environment of
    the process that started it, so a job launched from such a process would attach its run to that service, where
    an earlier attempt's stream of the same run id may still be open ("run ID ... is in use")."""
    env.pop("WANDB_SERVICE", None)


def wandb_run_id(run_dir: Path) -> str:
    """One W&B run id per run directory, the same for every requeue and `hpc-grpo resume` (WANDB_RUN_ID with
    WANDB_RESUME=allow), and distinct for two runs of the same name under different runs roots."""
    path = Path(run_dir)
    digest = hashlib.sha256(str(path).encode()).hexdigest()[:8]
    name = re.sub(r"[^A-Za-z0-9_-]", "_", path.name)[:55]
    return f"{name}-{digest}"


def yours(spec_file: Path) -> bool:
    """Whether a run is this user's: its spec.yaml is theirs and readable. A runs root may be shared (slurm-dev's
    /tmp/hpc-grpo-runs): another user's run there is not listed, picked as the newest, or pruned by --all."""
    try:
        return spec_file.stat().st_uid == os.getuid() and os.access(spec_file, os.R_OK)
    except OSError:
        return False


def scan_runs(roots: list[Path]) -> tuple[list[Path], int]:
    """(this user's run directories (those holding a spec.yaml) under the given roots, newest first; how many
    other users' runs were passed over)."""
    found: dict[Path, float] = {}
    others: set[Path] = set()
    for root in roots:
        if root.is_dir():
            for spec in layout.find_specs(root):
                if yours(spec):
                    found[spec.parent.resolve()] = spec.stat().st_mtime
                else:
                    others.add(spec.parent.resolve())
    return sorted(found, key=found.__getitem__, reverse=True), len(others)


def find_runs(roots: list[Path]) -> list[Path]:
    """This user's run directories under the given roots, newest first."""
    return scan_runs(roots)[0]


def run_summary(run_dir: Path) -> dict[str, Any]:
    history = [e for e in read_history(run_dir) if e.purpose not in EVENTS]
    return {"name": run_dir.name, "path": str(run_dir), "jobs": [e.job_id for e in history],
            "last_purpose": history[-1].purpose if history else None}

