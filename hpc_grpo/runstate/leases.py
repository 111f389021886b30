"""Reader leases: a reader (evaluation, export) holds checkpoint N against pruning while it reads it.

Files in RUN_DIR: leases/step_N.HOST.ID.PID.lease, created under the run's checkpoint lock (.checkpoints.lock) so
a prune already deciding finishes first and one starting later sees the lease.
"""

from __future__ import annotations

import json
import os
import socket
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from hpc_grpo.runstate import layout
from hpc_grpo.runstate.runs import checkpoint_lock

LEASE_MAX_AGE_S = 2 * 86400  # a lease from another host whose holder cannot be asked is trusted this long


def _lease_files(run_dir: Path) -> Iterator[tuple[int, str, int, Path]]:
    folder = layout.leases_dir(run_dir)
    try:
        names = os.listdir(folder)
    except OSError:
        return
    for name in names:
        lease = layout.parse_lease(name)
        if lease is not None:
            yield *lease, folder / name


def active_leases(run_dir: Path, now: float | None = None) -> frozenset[int]:
    """Steps a live reader holds. A lease of this host whose process is gone is stale (ignored)."""
    now = time.time() if now is None else now
    host = socket.gethostname()
    steps = set()
    for step, lhost, pid, path in _lease_files(run_dir):
        if lhost == host:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                continue
            except PermissionError:
                pass
        else:
            try:
                if now - path.lstat().st_mtime > LEASE_MAX_AGE_S:
                    continue
            except OSError:
                continue
        steps.add(step)
    return frozenset(steps)


@contextmanager
def lease(run_dir: Path, step: int) -> Iterator[Path]:
    """Hold checkpoint `step` (and its export) against pruning while reading it: evaluation and export take one.

    The lease file is created under the run's checkpoint lock, so a prune already deciding finishes first and
    one starting later sees the lease. After entering, check the checkpoint still exists (a prune may have
    removed it just before). The file goes when the block ends; a crashed holder's lease is ignored later.
    """
    run_dir = Path(run_dir)
    path = layout.lease_file(run_dir, step, socket.gethostname(), uuid.uuid4().hex[:8], os.getpid())
    with checkpoint_lock(run_dir):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"step": int(step), "pid": os.getpid(), "time": time.time()}) + "\n")
    try:
        yield path
    finally:
        path.unlink(missing_ok=True)
