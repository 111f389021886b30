"""Prune a run's checkpoints: list them, decide with the retention policy (hpc_grpo.runstate.retention) and
remove what it lets go, all under the run's checkpoint lock; the in-job entry point (job_prune) never fails a job.

Checkpoints are read only through hpc_grpo.runstate.checkpoints. Completeness is checked in full only where
it changes a verdict (newest first until keep_last complete ones are found, milestones, the best):
a checkpoint that goes either way is not opened, which keeps listing 1,000 checkpoints fast. Resume
preparation does not use this module and always checks in full. Removal never follows a symlink and never
leaves the folder it must stay in (remove_entry).

Files in RUN_DIR: checkpoints/, checkpoints-incomplete/, exports/step_N/ (go with their checkpoint),
.checkpoints.lock (while held).
"""

from __future__ import annotations

import os
import shutil
import stat
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from hpc_grpo.config.engine_traits import traits_of
from hpc_grpo.runstate import checkpoints as ck
from hpc_grpo.runstate import layout
from hpc_grpo.runstate.leases import active_leases
from hpc_grpo.runstate.metrics import logged_metrics
from hpc_grpo.runstate.retention import (
    Item,
    Policy,
    Protections,
    Verdict,
    decide,
    decide_quarantine,
    metric_per_checkpoint,
)
from hpc_grpo.runstate.runs import checkpoint_lock

WORKERS = 8  # threads for listing and removal (tools/bench_prune.py measures 1 against 8)


# --------------------------------------------------------------------------------------- listing
def footprint(path: Path) -> tuple[int, float]:
    """Bytes of regular files below path and their newest mtime (symlinks not followed, not counted)."""
    size, newest = 0, 0.0
    stack = [os.fspath(path)]
    while stack:
        try:
            with os.scandir(stack.pop()) as it:
                for e in it:
                    if e.is_dir(follow_symlinks=False):
                        stack.append(e.path)
                        newest = max(newest, e.stat(follow_symlinks=False).st_mtime)
                    elif e.is_file(follow_symlinks=False):
                        st = e.stat(follow_symlinks=False)
                        size += st.st_size
                        newest = max(newest, st.st_mtime)
        except OSError:
            continue
    if not newest:
        try:
            newest = os.lstat(path).st_mtime
        except OSError:
            pass
    return size, newest


def _parallel(fn: Any, args: Sequence[Any], workers: int | None = None) -> list[Any]:
    """Threads pay on many entries (stat and unlink release the GIL; parallel filesystems serve them at once)."""
    workers = workers or WORKERS
    if len(args) < 16 or workers == 1:
        return [fn(a) for a in args]
    with ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(fn, args))


def scan(run_dir: Path, engine: str, policy: Policy, prot: Protections) -> list[Item]:
    """Every checkpoint with size and mtime; completeness opened only where it can change a verdict."""
    run_dir = Path(run_dir)
    found = ck.candidates(run_dir, engine)
    prints = _parallel(lambda sp: footprint(sp[1]) if not sp[1].is_symlink() else (0, os.lstat(sp[1]).st_mtime), found)
    exports = _parallel(lambda sp: footprint(layout.export_dir(run_dir, sp[0]))[0], found)
    items = {s: Item(s, p, None, "not opened", sz, mt, ex) for (s, p), (sz, mt), ex in zip(found, prints, exports)}

    def check(step: int) -> bool:
        it = items[step]
        if it.complete is None:
            c = ck.judge(it.path, engine, step)
            items[step] = replace(it, complete=c.complete, reason=c.reason)
        return bool(items[step].complete)

    n_complete = 0
    for step in sorted(items, reverse=True):  # newest first, until keep_last complete ones are known
        if n_complete >= max(policy.keep_last, 1):
            break
        n_complete += check(step)
    if policy.keep_every:
        for step in items:
            if step % policy.keep_every == 0:
                check(step)
    if policy.keep_best:
        # best first, ties newest first: the same order best_step() picks in
        sign = 1 if policy.best_mode == "max" else -1
        order = sorted((s for s in items if s in prot.metrics), key=lambda s: (sign * prot.metrics[s], s), reverse=True)
        for step in order:
            if check(step):
                break
    return [items[s] for s in sorted(items)]


def quarantined(run_dir: Path) -> list[tuple[Path, float, int]]:
    """checkpoints-incomplete/ entries: (path, when set aside: ctime of the entry, which a move updates, bytes)."""
    folder = layout.quarantine_dir(run_dir)
    out = []
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return []
    for e in entries:
        st = e.stat(follow_symlinks=False)
        size = footprint(Path(e.path))[0] if e.is_dir(follow_symlinks=False) else 0
        out.append((Path(e.path), max(st.st_ctime, st.st_mtime), size))
    return sorted(out)


# -------------------------------------------------------------------------------------- removal
class UnsafePath(RuntimeError):
    """A removal target is not a direct entry of the folder it must be in."""


def remove_entry(path: Path, folder: Path) -> None:
    """Remove one entry of `folder` without following links: a symlink is unlinked (never what it points at),
    a folder is removed by shutil.rmtree's fd-based walk (it does not descend through symlinks)."""
    real_folder = os.path.realpath(folder)
    if os.path.realpath(path.parent) != real_folder or path.name in ("", ".", "..") or "/" in path.name:
        raise UnsafePath(f"{path} is not an entry of {folder}")
    target = os.path.join(real_folder, path.name)
    try:
        st = os.lstat(target)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(st.st_mode):
        if not shutil.rmtree.avoids_symlink_attacks:  # pragma: no cover - Linux has the fd-based walk
            raise UnsafePath("this platform's shutil.rmtree may follow symlinks: refusing to remove")
        shutil.rmtree(target)
    else:
        os.unlink(target)


@dataclass
class PruneResult:
    run_dir: Path
    engine: str
    policy: Policy
    verdicts: list[Verdict]
    quarantine: list[Verdict]
    dry_run: bool
    freed_bytes: int = 0
    errors: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {
            "run_dir": str(self.run_dir), "engine": self.engine, "dry_run": self.dry_run,
            "policy": asdict(self.policy), "freed_bytes": self.freed_bytes,
            "checkpoints": [v.as_dict() for v in self.verdicts],
            "quarantine": [v.as_dict() for v in self.quarantine],
            "errors": self.errors, "notes": self.notes,
        }


def prune_run(run_dir: Path, engine: str, policy: Policy, *, dry_run: bool = False, now: float | None = None,
              lock_timeout_s: float | None = 600.0) -> PruneResult:
    """List, decide and (unless dry_run) remove, all under the run's checkpoint lock so no save, resume
    preparation, second prune or new lease interleaves. Exports go with their checkpoint."""
    run_dir = Path(run_dir)
    with checkpoint_lock(run_dir, timeout_s=7 * 86400 if lock_timeout_s is None else lock_timeout_s):
        now = time.time() if now is None else now
        logged = logged_metrics(run_dir, engine) if policy.keep_best else {}
        steps = [s for s, _ in ck.candidates(run_dir, engine)]
        metrics = metric_per_checkpoint(logged, steps, policy.keep_best) if policy.keep_best else {}
        tracker = ck.tracker_step(run_dir) if traits_of(engine).step_tracker else None
        prot = Protections(now=now, tracker_step=tracker, leased=active_leases(run_dir, now), metrics=metrics)
        items = scan(run_dir, engine, policy, prot)
        verdicts = decide(items, policy, prot)
        qverdicts = decide_quarantine(quarantined(run_dir), policy, now)
        result = PruneResult(run_dir, engine, policy, verdicts, qverdicts, dry_run)
        if policy.keep_best and not metrics:
            result.notes.append(f"no logged values of {policy.keep_best}: keep_best kept nothing extra")
        if policy.max_bytes is not None:
            kept = sum(v.size_bytes + v.export_bytes for v in verdicts if v.keep)
            if kept > policy.max_bytes:
                result.notes.append(f"protected checkpoints alone hold {kept} bytes, over max_bytes {policy.max_bytes}")
        gone = [v for v in verdicts if not v.keep]
        result.freed_bytes = sum(v.size_bytes + v.export_bytes for v in gone)
        result.freed_bytes += sum(v.size_bytes for v in qverdicts if not v.keep)
        if dry_run:
            return result
        ckpt_folder = layout.checkpoints_dir(run_dir)
        jobs: list[tuple[Path, Path]] = []
        for v in gone:
            jobs.append((v.path, ckpt_folder))
            export = layout.export_dir(run_dir, v.step)
            if os.path.lexists(export):
                jobs.append((export, layout.exports_dir(run_dir)))
        jobs += [(v.path, layout.quarantine_dir(run_dir)) for v in qverdicts if not v.keep]

        def remove(job: tuple[Path, Path]) -> str:
            try:
                remove_entry(*job)
                return ""
            except (OSError, UnsafePath) as exc:
                return f"{job[0]}: {exc}"

        result.errors = [e for e in _parallel(remove, jobs) if e]
        return result


def fmt_bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return str(n)


def prune_spec(run_dir: Path, *, lock_timeout_s: float | None = 600.0, **overrides: Any) -> PruneResult:
    """The recipe's policy applied to a run (what jobs call at start, after saves and at the end)."""
    from hpc_grpo.config.resolve import load_frozen

    spec = load_frozen(layout.spec_file(run_dir))
    policy = Policy.from_recipe(spec.recipe.checkpoint, **overrides)
    return prune_run(Path(run_dir), spec.recipe.engine, policy, lock_timeout_s=lock_timeout_s)


def summary(result: PruneResult) -> str:
    """One log line for jobs."""
    kept = [v.step for v in result.verdicts if v.keep]
    gone = [v.step for v in result.verdicts if not v.keep]
    q = sum(1 for v in result.quarantine if not v.keep)
    verb = "would remove" if result.dry_run else "removed"
    extra = f", {q} quarantined" if q else ""
    errs = f"; {len(result.errors)} error(s): {result.errors[0]}" if result.errors else ""
    return f"prune: kept steps {kept or '-'}, {verb} {gone or '-'}{extra} ({fmt_bytes(result.freed_bytes)}){errs}"


def job_prune(run_dir: Path, when: str, log: Any = print, lock_timeout_s: float = 120.0,
              **overrides: Any) -> PruneResult | None:
    """Apply the run's policy from inside a job (start, after a save, end). Never fails the job: a busy lock or a
    filesystem error is logged and retried at the next occasion. trl's job passes grace_s=0: its saves hold the
    checkpoint lock, so while prune holds it nothing is being written (verl's saves do not: the grace applies)."""
    from hpc_grpo.common.yamlio import SpecError

    try:
        result = prune_spec(Path(run_dir), lock_timeout_s=lock_timeout_s, **overrides)
    except (TimeoutError, OSError, SpecError) as exc:
        log(f"prune ({when}) skipped: {exc}")
        return None
    log(f"{summary(result)} [{when}]")
    return result
