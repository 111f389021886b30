"""Whether a run is trained: what the evaluation job checks before it starts, and what `status` says.

A run is trained when its training wrote train_done.json, or when its newest complete checkpoint is at the run's
final step: a verl run can save its last checkpoint and then fail in W&B's teardown, and that policy is as
trained as any, unless a health finding stopped it (health.stop_on: its checkpoint may well be the last one).
The eval job is queued `afterany` the training job (Slurm keeps one job id across
requeues, so the dependency resolves only at that job's final end) and asks this module first, so a job that ended
before its last save (a failure, a time limit with no requeue left, a cancel) never gets a premature evaluation.
Light on purpose (status imports it): no torch.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hpc_grpo.runstate import checkpoints as ck
from hpc_grpo.runstate import layout, runs
from hpc_grpo.config.spec import RunSpec
from hpc_grpo.config.steps import total_steps as from_recipe



@dataclass(frozen=True, slots=True)
class Trained:
    """The verdict and its evidence."""

    trained: bool
    reason: str  # "train_done.json: step 24" | "final checkpoint step 24 written (of 24 steps)" | why not
    step: int | None = None  # the final step, when trained
    by_checkpoint: bool = False  # trained by its final checkpoint, without train_done.json


def done_record(run_dir: Path) -> dict[str, Any] | None:
    """train_done.json when it parses (the trainer writes it atomically at the end), else None."""
    try:
        data = json.loads(layout.done_file(run_dir).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def health_stop(run_dir: Path) -> str | None:
    """Why the run's latest job stopped on a health finding (health.stop_on), when it did and no job has started
    since (a resume goes on from its checkpoint); else None."""
    for entry in reversed(runs.read_history(run_dir)):
        if entry.purpose == "start":
            return None
        if entry.purpose == "failed" and entry.data.get("cause") == "health":
            return entry.note
    return None


def total_steps(spec: RunSpec, newest: ck.Checkpoint | None) -> tuple[int | None, str]:
    """(the run's step count, where it came from): what the engine recorded in its checkpoint (trl's max_steps),
    else the recipe's train.total_training_steps, else epochs x (rows // batch), verl's rule (drop_last)."""
    recorded = ck.recorded_total_steps(newest) if newest is not None else None
    if recorded:
        return recorded, f"{ck.TRAINER_STATE} max_steps"
    total, estimated = from_recipe(spec, None)
    return total, ("epochs x rows / batch" if estimated else "train.total_training_steps")


def decide(spec: RunSpec, live_training: dict[str, str] | None = None) -> Trained:
    """Trained or not, with the reason. live_training: training jobs of the run still queued or running (job id ->
    state); while one is, the run is not finished (e.g. a requeue in progress), whatever is on disk."""
    run_dir = spec.path
    done = done_record(run_dir)
    if done is not None:
        step = done.get("final_step")
        early = done.get("early_stop")
        why = f"; {early['reason']}" if isinstance(early, dict) and early.get("reason") else ""
        return Trained(True, f"{layout.DONE_FILE}: step {step}{why}", step if isinstance(step, int) else None)
    if live_training:
        jobs = ", ".join(f"{j} ({s})" for j, s in live_training.items())
        return Trained(False, f"training job {jobs} has not ended: its run is not finished yet")
    stop = health_stop(run_dir)
    if stop is not None:
        return Trained(False, stop)
    newest = ck.newest_complete(ck.list_checkpoints(run_dir, spec.recipe.engine))
    if newest is None:
        return Trained(False, f"no {layout.DONE_FILE} and no complete checkpoint in {layout.checkpoints_dir(run_dir)}")
    total, source = total_steps(spec, newest)
    if total is None:
        return Trained(False, f"no {layout.DONE_FILE}, and the run's total steps are unknown ({source}): cannot tell "
                              f"whether step {newest.step} is the last")
    if newest.step >= total:
        return Trained(True, f"final checkpoint step {newest.step} written (of {total} steps, {source})", newest.step,
                       by_checkpoint=True)
    return Trained(False, f"no {layout.DONE_FILE}; the newest complete checkpoint is step {newest.step} of {total} "
                          f"({source}): training did not finish")
