"""Room for the checkpoints: one checkpoint's size, how many the retention policy keeps at once, and whether they
fit in the free space of the runs root (preflight's check, run at plan and at submit)."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

from hpc_grpo.common.findings import Finding, info, warning
from hpc_grpo.config.spec import RunSpec
from hpc_grpo.config.models import ModelShape


def checkpoint_gib(spec: RunSpec, shape: ModelShape | None) -> float | None:
    """One checkpoint's size in GiB (hpc_grpo.planning.ckpt_size: the one sizing rule)."""
    if shape is None:
        return None
    from hpc_grpo.planning.ckpt_size import checkpoint_size
    from hpc_grpo.planning.schedule import lora_params_of

    r = spec.recipe
    return checkpoint_size(r.engine, r.backend, shape.params, lora_params_of(spec, shape)).gib

def kept_checkpoints(spec: RunSpec) -> tuple[int, str]:
    """How many checkpoints the retention policy can hold at once (plus the one being written), and how that
    count was reached. Milestones are counted when the run's length in steps is known."""
    c = spec.recipe.checkpoint
    steps = spec.recipe.train.total_training_steps
    parts = [f"{c.keep_last} newest"]
    n = c.keep_last
    if c.keep_every:
        if steps:
            saves = range(c.save_freq, steps + 1, c.save_freq)
            milestones = sum(1 for s in saves if s % c.keep_every == 0)
            n += milestones
            parts.append(f"up to {milestones} milestones")
        else:
            parts.append("milestones (not counted: the step count is only known at run time)")
    if c.keep_best:
        n += 1
        parts.append("the best")
    if steps:
        n = min(n, len(range(c.save_freq, steps + 1, c.save_freq)) + 1)
    return n + 1, " + ".join(parts) + " + 1 being written"


def check_disk(spec: RunSpec, shape: ModelShape | None, root: Path, make: Callable[..., Finding] = warning,
               filesystem: str = "") -> list[Finding]:
    """The checkpoints the retention policy keeps, plus the one being written, must fit in the free space of the
    runs root (`root`: the nearest existing folder of it; `filesystem`: its mount point and type, named in the
    finding so a reader knows which disk was measured). A run that does not fit dies mid-way (the reference GPU run
    of docs/benchmarks.md died at step 80 of 105 on a full disk). Called by preflight: a warning in plan, an error
    at submit (`make`)."""
    r = spec.recipe
    size = checkpoint_gib(spec, shape)
    count, how = kept_checkpoints(spec)
    need = r.checkpoint.disk_gb or (size * count if size else None)
    if need is None:
        return []
    if r.checkpoint.max_bytes is not None and not r.checkpoint.disk_gb and size:
        need = min(need, r.checkpoint.max_bytes / 2**30 + size)  # the cap, plus the save that may go over it
        how += ", capped by checkpoint.max_bytes"
    what = f"retention keeps {how}: ~{need:.1f} GiB" + (f" (~{size:.1f} GiB each)" if size else "")
    free = shutil.disk_usage(root).free / 2**30
    on = f" (filesystem {filesystem})" if filesystem else ""
    msg = f"{what}; {root}{on} has {free:.0f} GiB free"
    if need > free:
        return [make("checkpoint.keep_last", msg, "lower checkpoint.keep_last or keep_every, set checkpoint.max_bytes, "
                     "enable LoRA, or use a bigger runs_root")]
    return [info("checkpoint.keep_last", msg)]
