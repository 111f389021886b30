"""`hpc-grpo export RUN [--step N]`: one complete checkpoint -> RUN/exports/step_N/, a Hugging Face folder, and
the `hpc-grpo submit` line of a new run that starts from it.

The checkpoint is leased while it is read (prune leaves it alone) and judged again under the lease. A checkpoint
that cannot be exported here raises one of FAILURES (exit 1: the message says what to do); a --step that names
no complete checkpoint is bad input (SpecError, exit 2).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hpc_grpo.common.yamlio import SpecError
from hpc_grpo.evaluation.export import ExportError
from hpc_grpo.job.trl_job import JobError

FAILURES: tuple[type[Exception], ...] = (ExportError, JobError)


@dataclass(frozen=True)
class Exported:
    folder: Path
    how: str  # export.json's account of how the folder was made
    new_run: str  # the submit line of a new run from these weights


def export_run(run: str | None, step: int | None, starting: Callable[[Any], None]) -> Exported:
    """Export the checkpoint of `step` (default: the newest complete one); `starting(checkpoint)` is told which
    checkpoint, and from where, before the (minutes long) merge begins."""
    from hpc_grpo.planning.world_size import new_run_command
    from hpc_grpo.commands.status import locate_run
    from hpc_grpo.config.resolve import load_frozen
    from hpc_grpo.evaluation import export
    from hpc_grpo.job.eval_job import EvalError, base_model_path, choose
    from hpc_grpo.runstate import layout

    spec = load_frozen(layout.spec_file(locate_run(run)))
    try:
        (ckpt,) = choose(spec, [] if step is None else [step], all_kept=False)
    except EvalError as exc:
        raise SpecError(str(exc), key="run" if step is None else "--step") from None
    with export.leased(spec.path, spec.recipe.engine, ckpt.step) as fresh:
        starting(fresh)
        folder = export.export_checkpoint(spec.path, fresh.step, fresh.path, fresh.layout, base_model_path(spec))
    return Exported(folder, export.export_info(folder).get("how", ""), new_run_command(spec, folder))
