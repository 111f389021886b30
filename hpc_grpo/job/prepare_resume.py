"""Resume preparation, run at every start of a job (first start, requeue, `hpc-grpo resume`), for both
engines, before the engine starts: the newest COMPLETE checkpoint is where training goes on from.

- Newer incomplete checkpoints (a save cut by a kill, a full disk) move to RUN_DIR/checkpoints-incomplete/:
  never deleted, and never again in the way (trl's rotation would count them, verl would load them).
- verl is pointed at the chosen folder with `trainer.resume_mode=resume_path trainer.resume_from_path=...`,
  or `trainer.resume_mode=disable` when there is none. Never `auto`: it crashes on an empty tracker and
  silently restarts from step 0 on a missing one. The pinned verl reads the tracker even in resume_path mode
  (find_latest_ckpt_path runs first and int('') raises), so an unreadable or stale tracker is rewritten
  to the chosen step; the old content is kept in the history line.
- What it did goes into history.jsonl as a "start" event of the job.
- A verl FSDP checkpoint saved at another world size than the job's is refused before anything moves (verl
  cannot load it; hpc_grpo.planning.world_size, which `hpc-grpo resume` applies first): the job fails at once
  with a "failed" event in the history that says what to do, instead of dying at load.

All of it happens under runs.checkpoint_lock(run_dir), the lock prune takes too.

In-job use: trl_job calls `prepare()`; node 0 of a verl job (hpc_grpo.job.verl_node) calls `prepare_for_job`
and appends the overrides to main_ppo's command line (also written to a file, one Hydra override a line, for a
custom driver). `python -m hpc_grpo.job.prepare_resume --spec RUN_DIR/spec.yaml --args-out FILE` does the same
from a shell.
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hpc_grpo.runstate import checkpoints as ck
from hpc_grpo.runstate import layout, runs
from hpc_grpo.common.atomic import write_text_atomic
from hpc_grpo.cluster.job_env import job_identity, restart_count
from hpc_grpo.engines import get_engine, sync_break

if TYPE_CHECKING:
    from hpc_grpo.config.spec import RunSpec


@dataclass(frozen=True, slots=True)
class Prepared:
    """Where a job start resumes from, and what preparation changed on disk."""

    engine: str
    checkpoint: ck.Checkpoint | None  # None: start from step 0
    quarantined: list[tuple[str, str, str]] = field(default_factory=list)  # (old path, new path, reason)
    left: list[tuple[str, str]] = field(default_factory=list)  # older incomplete ones, left for prune: (path, reason)
    overrides: list[str] = field(default_factory=list)  # verl's resume overrides; [] for trl
    tracker_before: str | None = None  # verl tracker content before a repair; None when left alone

    @property
    def step(self) -> int:
        return self.checkpoint.step if self.checkpoint else 0

    def summary(self) -> str:
        where = (f"resumes from {self.checkpoint.path.name} (step {self.step})" if self.checkpoint
                 else "starts from step 0 (no complete checkpoint)")
        parts = [where]
        for old, new, why in self.quarantined:
            parts.append(f"moved incomplete {Path(old).name} ({why}) to {new}")
        if self.tracker_before is not None:
            parts.append(f"tracker {self.tracker_before!r} rewritten to {self.step}")
        return "; ".join(parts)

    def as_dict(self) -> dict[str, Any]:
        return {"engine": self.engine, "step": self.step,
                "checkpoint": str(self.checkpoint.path) if self.checkpoint else None,
                "quarantined": [{"from": o, "to": n, "reason": r} for o, n, r in self.quarantined],
                "left_incomplete": [{"path": p, "reason": r} for p, r in self.left],
                "overrides": self.overrides, "tracker_before": self.tracker_before}


def prepare(run_dir: Path, engine: str, spec: RunSpec | None = None) -> Prepared:
    """Choose the checkpoint, quarantine newer broken ones, fix verl's tracker; under the checkpoint lock.
    With the job's spec, a checkpoint the job cannot load at its world size raises world_size.WorldSizeMismatch
    before anything changes on disk."""
    run_dir = Path(run_dir)
    with runs.checkpoint_lock(run_dir):
        ckpts = ck.list_checkpoints(run_dir, engine)
        best = ck.newest_complete(ckpts)
        if spec is not None:
            from hpc_grpo.planning.world_size import check_world_size

            check_world_size(spec, best)
        floor = best.step if best else -1
        moved: list[tuple[str, str, str]] = []
        left: list[tuple[str, str]] = []
        for c in ckpts:
            if c.complete or c.path.is_symlink():
                continue
            if c.step > floor:
                moved.append((str(c.path), str(ck.quarantine(run_dir, c)), c.reason))
            else:
                left.append((str(c.path), c.reason))
        tracker_before = None
        trainer = get_engine(engine)
        overrides = trainer.resume_overrides(best.path if best else None)
        if trainer.traits.step_tracker and best is not None and ck.tracker_step(run_dir) != best.step:
            tracker_before = _read_tracker(run_dir)
            _write_tracker(run_dir, best.step)
    return Prepared(engine, best, moved, left, overrides, tracker_before)


def record(run_dir: Path, prepared: Prepared, job_id: str, executor: str) -> None:
    """The job's "start" event in history.jsonl: which attempt, from which checkpoint, what moved."""
    data = prepared.as_dict()
    data["restart_count"] = restart_count()
    data["host"] = os.uname().nodename
    if sync_break.enabled():
        data["test_hook"] = sync_break.ENV  # status warns about this start (engines/sync_break)
    runs.append_history(Path(run_dir), job_id, "start", executor, note=prepared.summary(), data=data)


def prepare_and_record(run_dir: Path, engine: str, spec: RunSpec | None = None) -> Prepared:
    """prepare(), its "start" line in the history, and the disk-full reserve (hpc_grpo.job.disk); a refused
    world size becomes a "failed" line (status shows it as why the job stopped) and is raised again."""
    from hpc_grpo.job import disk
    from hpc_grpo.planning.world_size import WorldSizeMismatch

    job_id, executor = job_identity()
    try:
        prepared = prepare(run_dir, engine, spec)
    except WorldSizeMismatch as exc:
        runs.append_history(Path(run_dir), job_id, "failed", executor, note=" ".join(str(exc).split()),
                            data=exc.data)
        raise
    record(run_dir, prepared, job_id, executor)
    disk.ensure_reserve(run_dir)
    return prepared


def _read_tracker(run_dir: Path) -> str:
    try:
        return ck.tracker_file(run_dir).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""  # missing


def _write_tracker(run_dir: Path, step: int) -> None:
    """Atomic (verl writes it with a plain open("w"), which a crash leaves empty)."""
    write_text_atomic(ck.tracker_file(run_dir), str(step))


def prepare_for_job(spec_path: Path, args_out: Path | None = None) -> list[str] | None:
    """Resume preparation at a job's start from its frozen spec: the engine's resume overrides (also written to
    `args_out`, one a line), or None when it failed (said on stderr; a refused world size is in the history)."""
    from hpc_grpo.config.resolve import load_frozen
    from hpc_grpo.common.yamlio import SpecError

    try:
        spec = load_frozen(spec_path)
        prepared = prepare_and_record(spec.path, spec.recipe.engine, spec)
    except (SpecError, OSError, TimeoutError) as exc:
        print(f"hpc-grpo: resume preparation failed: {exc}", file=sys.stderr, flush=True)
        return None
    print(f"hpc-grpo: resume preparation: {prepared.summary()}", flush=True)
    if args_out:
        args_out.parent.mkdir(parents=True, exist_ok=True)
        args_out.write_text("".join(f"{o}\n" for o in prepared.overrides), encoding="utf-8")
    return prepared.overrides


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hpc_grpo.job.prepare_resume", description=__doc__.split("\n")[0])
    parser.add_argument("--spec", required=True, type=Path, help=f"RUN_DIR/{layout.SPEC_FILE} (the frozen run spec)")
    parser.add_argument("--args-out", type=Path, help="write the engine's resume overrides here, one per line")
    args = parser.parse_args(argv)
    return 0 if prepare_for_job(args.spec, args.args_out) is not None else 2


if __name__ == "__main__":
    sys.exit(main())
