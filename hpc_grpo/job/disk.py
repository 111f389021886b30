"""A full disk during a save, said plainly: which filesystem, which checkpoint is torn, what to do.

Without this a trl job dies with torch's "PytorchStreamWriter failed writing file ... unexpected pos" and
no word of ENOSPC, and cannot even log or record its failure: the job log and history.jsonl live in the
run directory, on the full disk. So every job start keeps a small reserve file in the run directory
(RUN_DIR/.hpc-grpo-reserve, our own ballast, never data); on a full disk the job removes it first, which
leaves room for the message in the log and a "failed" line in the history.
"""

from __future__ import annotations

import argparse
import errno
import os
import re
import sys
from pathlib import Path

from hpc_grpo.runstate import checkpoints as ck
from hpc_grpo.runstate import layout, runs

RESERVE_BYTES = 64 * 1024
_TORN_WRITE = re.compile(r"unexpected pos|No space left|file write failed|PytorchStreamWriter failed", re.I)


def ensure_reserve(run_dir: Path) -> bool:
    """Create the reserve file if missing; False when there is no room even for it (already full)."""
    path = layout.reserve_file(run_dir)
    if path.is_file() and path.stat().st_size >= RESERVE_BYTES:
        return True
    try:
        with open(path, "wb") as fh:
            fh.write(b"\0" * RESERVE_BYTES)
            fh.flush()
            os.fsync(fh.fileno())
    except OSError:
        path.unlink(missing_ok=True)
        return False
    return True


def release_reserve(run_dir: Path) -> None:
    layout.reserve_file(run_dir).unlink(missing_ok=True)


def _chain(exc: BaseException | None) -> list[BaseException]:
    seen: list[BaseException] = []
    while exc is not None and exc not in seen:
        seen.append(exc)
        exc = exc.__cause__ or exc.__context__
    return seen


def _mount_of(path: Path) -> tuple[str, str]:
    """(mount point, filesystem type) holding path, from /proc/self/mounts (longest prefix wins)."""
    real = os.path.realpath(path)
    best = ("/", "?")
    try:
        lines = Path("/proc/self/mounts").read_text().splitlines()
    except OSError:
        return best
    for line in lines:
        parts = line.split()
        if len(parts) < 3:
            continue
        mnt = parts[1].replace("\\040", " ")
        if (real == mnt or real.startswith(mnt.rstrip("/") + "/")) and len(mnt) >= len(best[0]):
            best = (mnt, parts[2])
    return best


def _human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def is_disk_full(run_dir: Path, exc: BaseException | None) -> bool:
    """ENOSPC anywhere in the exception chain; or torch's torn-write error while the disk has less room
    than the newest checkpoint needs (torch hides the errno)."""
    chain = _chain(exc)
    if any(isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT) for e in chain):
        return True
    if not any(_TORN_WRITE.search(str(e)) for e in chain) and exc is not None:
        return False
    st = os.statvfs(run_dir)
    free = st.f_bavail * st.f_frsize
    ckpts = [c for engine in ck.ENGINES for c in ck.list_checkpoints(run_dir, engine)]
    need = max([c.size_bytes for c in ckpts if c.complete] + [1 << 20])
    return free < need


def explain(run_dir: Path, run_name: str, engine: str) -> str:
    """The one message: the disk, how full, the torn checkpoint, the one to resume from, the command."""
    run_dir = Path(run_dir)
    st = os.statvfs(run_dir)
    mnt, fstype = _mount_of(run_dir)
    ckpts = ck.list_checkpoints(run_dir, engine)
    best = ck.newest_complete(ckpts)
    torn = [c for c in ckpts if not c.complete and c.step > (best.step if best else -1)]
    parts = [f"the disk of the run directory is full: {mnt} ({fstype}) holding {run_dir} has "
             f"{_human(st.f_bavail * st.f_frsize)} free of {_human(st.f_blocks * st.f_frsize)}"]
    if torn:
        parts.append(f"the save of {', '.join(c.path.name for c in torn)} did not finish ({torn[-1].reason}); it is "
                     f"kept and moves to {layout.QUARANTINE_DIR}/ at the next start")
    parts.append(f"the newest complete checkpoint is {best.path.name} (step {best.step})" if best
                 else "there is no complete checkpoint yet")
    parts.append(f"free space on {mnt} (or grow it), then run: hpc-grpo resume {run_name}")
    return "; ".join(parts)


def report(run_dir: Path, message: str) -> None:
    """Make room (the reserve), then record the failure in the history; printing is the caller's."""
    from hpc_grpo.cluster.job_env import job_identity

    release_reserve(run_dir)
    job_id, executor = job_identity()
    try:
        runs.append_history(Path(run_dir), job_id, "failed", executor, note=f"disk full: {message}",
                            data={"cause": "disk full"})
    except OSError as exc:
        print(f"hpc-grpo: could not record the failure in {layout.HISTORY_FILE}: {exc}", file=sys.stderr, flush=True)


def check_after_failure(spec_path: Path) -> None:
    """After a driver failed (verl's node 0): say so plainly if the disk is full. Never raises."""
    from hpc_grpo.config.resolve import load_frozen

    try:
        spec = load_frozen(spec_path)
        if is_disk_full(spec.path, None):
            message = explain(spec.path, spec.run_name, spec.recipe.engine)
            report(spec.path, message)
            print(f"hpc-grpo: error: {message}", file=sys.stderr, flush=True)
    except Exception as exc:  # noqa: BLE001 - the driver's own failure is what the job reports
        print(f"hpc-grpo: disk check failed: {exc}", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    """After a driver failed: say so plainly if the disk is full. Exit 0 either way."""
    parser = argparse.ArgumentParser(prog="python -m hpc_grpo.job.disk", description=main.__doc__)
    parser.add_argument("--spec", required=True, type=Path)
    args = parser.parse_args(argv)
    check_after_failure(args.spec)
    return 0


if __name__ == "__main__":
    sys.exit(main())
