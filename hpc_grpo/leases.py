"""Reader leases on checkpoints: while an export or evaluation reads step N, prune must not remove it.

(Branch i10prune was to expose `lease(run_dir, step)`; it had not landed when the evaluation needed it, so this is
the small module the eval brief asked for. Prune asks `leased_steps`.) A lease is a file RUN/leases/step_N.HOST.PID
holding an flock for as long as the reader runs: a reader that dies (kill -9, node lost) releases the lock with its
process, so a stale file never protects a checkpoint forever; it is removed by the next reader or by prune.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

LEASE_DIR = "leases"


def _lease_path(run_dir: Path, step: int) -> Path:
    return Path(run_dir) / LEASE_DIR / f"step_{int(step)}.{socket.gethostname()}.{os.getpid()}"


@contextmanager
def lease(run_dir: Path, step: int, holder: str = "eval") -> Iterator[Path]:
    """Hold a reader lease on checkpoint `step` of the run for the duration of the block."""
    path = _lease_path(run_dir, step)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.write(fd, json.dumps({"step": int(step), "holder": holder, "pid": os.getpid(),
                                 "host": socket.gethostname(), "since": time.time()}).encode())
        yield path
    finally:
        path.unlink(missing_ok=True)
        os.close(fd)


def _held(path: Path) -> bool:
    """True while the lease's writer still holds its lock (trying to take it fails)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    else:
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False
    finally:
        os.close(fd)


def leased_steps(run_dir: Path, clean: bool = True) -> set[int]:
    """Steps some live reader holds; stale lease files (their reader died) are removed when clean."""
    folder = Path(run_dir) / LEASE_DIR
    steps: set[int] = set()
    if not folder.is_dir():
        return steps
    for path in folder.glob("step_*"):
        head = path.name.split(".", 1)[0].removeprefix("step_")
        if not head.isdigit():
            continue
        if _held(path):
            steps.add(int(head))
        elif clean:
            path.unlink(missing_ok=True)
    return steps
