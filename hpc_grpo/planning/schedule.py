"""The run's schedule before it is queued: how many steps, where checkpoints land, how big they
are, and whether one lands before the job's first time limit.

The pinned verl's arithmetic (trainer/ppo/ray_trainer.py): the train dataloader drops the last partial
batch, so steps per epoch = rows // data.train_batch_size; total = that x total_epochs unless
trainer.total_training_steps is set. A checkpoint is written when `save_freq > 0` and the step is a
multiple of save_freq OR the last step. A run whose save_freq exceeds its length therefore writes
only the final checkpoint: a time limit or a crash before the end loses everything.

Where the cluster's runs root holds a calibration from the user's own run (runstate.calibration, written by
`hpc-grpo report RUN --calibrate`), the model is scaled by that run's measured / modelled step time and its
measured start-up replaces STARTUP_S: any engine, GPUs or CPU. Otherwise the step time is a rough two-term estimate calibrated on a GRPO-LoRA run of Qwen2.5-3B-Instruct on 4x A100
(1024 prompts x n 5, 512 + 1024 tokens; docs/benchmarks.md, "Reference GPU run"): 105 steps took 6.5 h at n=5 and
11 h at n=10 before its last tuning, 6 h (~206 s/step) after. A fixed part scales with the parameters each GPU holds (weight sync to
vLLM, wake/sleep), a per-sample part with active parameters x tokens per GPU. Good to tens of percent.
Stdlib only (pyarrow is used for the parquet footer only when it is importable).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from hpc_grpo.planning.ckpt_size import CheckpointSize, checkpoint_size
from hpc_grpo.common.findings import Finding, info, warning
from hpc_grpo.config.models import ModelShape
from hpc_grpo.config.spec import RunSpec
from hpc_grpo.config.steps import dataset_rows
from hpc_grpo.engines import get_engine
from hpc_grpo.runstate.calibration import Calibration, newest

__all__ = ["Schedule", "estimate_step_s", "make_schedule", "predict_step", "schedule_findings"]

# Calibration (the reference GPU run): 105 steps, n=5 -> 6.5 h, n=10 -> 11 h; the tuned n=5 run -> 6 h.
_CAL_PARAMS_PER_GPU = 3.09e9 / 4
_CAL_TOKENS_PER_GPU = 1024 * 5 * (512 + 1024) / 4
_CAL_ACTIVE = 3.09e9
_T5, _T10, _TUNED = 6.5 * 3600 / 105, 11 * 3600 / 105, 6 * 3600 / 105
_PER_SAMPLE_5 = (_T10 - _T5) * (_TUNED / _T5)  # the n=5 -> n=10 difference is the per-sample part
_FIXED = _TUNED - _PER_SAMPLE_5
FIXED_S_PER_PARAM_PER_GPU = _FIXED / _CAL_PARAMS_PER_GPU
SAMPLE_S_PER_PARAM_TOKEN = _PER_SAMPLE_5 / (_CAL_ACTIVE * _CAL_TOKENS_PER_GPU)
GPU_SPEED = {"h100": 2.0, "h200": 2.2, "a100": 1.0}  # relative to an A100 (bf16 dense, rough)
STARTUP_S = 300  # Ray start, model load, vLLM init and graph capture before step 1 (rough)


def estimate_step_s(spec: RunSpec, shape: ModelShape) -> float:
    """Seconds per verl GRPO step (rough; see the module docstring)."""
    r = spec.recipe
    world = max(1, spec.world_size)
    speed = GPU_SPEED.get((spec.cluster.gpu_type or "a100").lower(), 1.0)
    tokens_per_gpu = r.batch.train * r.grpo.n * (r.data.max_prompt_length + r.data.max_response_length) / world
    fixed = FIXED_S_PER_PARAM_PER_GPU * shape.params / world
    per_sample = SAMPLE_S_PER_PARAM_TOKEN * shape.active_params * tokens_per_gpu
    return (fixed + per_sample) / speed


@dataclass
class Schedule:
    rows: int | None
    rows_source: str
    steps_per_epoch: int | None
    total_steps: int | None
    save_freq: int
    checkpoint_steps: list[int]
    size: CheckpointSize | None
    step_s: float | None = None
    steps_in_time_limit: int | None = None
    startup_s: float | None = None  # measured on this cluster (its calibration), else STARTUP_S applies
    step_source: str = ""  # where step_s comes from when it is the cluster's own calibration
    notes: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, object]:
        return {
            "rows": self.rows, "rows_source": self.rows_source, "steps_per_epoch": self.steps_per_epoch,
            "total_steps": self.total_steps, "save_freq": self.save_freq, "checkpoint_steps": self.checkpoint_steps,
            "checkpoint_gib": None if self.size is None else round(self.size.gib, 2),
            "checkpoint_layout": None if self.size is None else self.size.layout,
            "step_s": None if self.step_s is None else round(self.step_s, 1),
            "steps_in_time_limit": self.steps_in_time_limit,
        }


def checkpoint_steps(total: int, save_freq: int) -> list[int]:
    """verl's rule: every multiple of save_freq, and the last step."""
    if save_freq <= 0 or total <= 0:
        return []
    steps = list(range(save_freq, total + 1, save_freq))
    return steps if steps and steps[-1] == total else [*steps, total]


def lora_params_of(spec: RunSpec, shape: ModelShape) -> float:
    from hpc_grpo.config.models import lora_trainable_params

    return float(lora_trainable_params(shape, spec.recipe.lora.rank))


def make_schedule(spec: RunSpec, shape: ModelShape | None) -> Schedule:
    r = spec.recipe
    rows: int | None
    if r.data.train_rows is not None:
        rows, source = r.data.train_rows, "data.train_rows in the recipe"
        found, where = dataset_rows(r.data.train_files)
        if found is not None and not where.startswith("known") and found != rows:
            rows, source = found, f"{where} (data.train_rows says {r.data.train_rows})"
    else:
        rows, source = dataset_rows(r.data.train_files)
    per_epoch = rows // r.batch.train if rows is not None else None
    if r.train.total_training_steps is not None:
        total: int | None = r.train.total_training_steps
    else:
        total = per_epoch * r.train.total_epochs if per_epoch is not None else None
    ckpts = checkpoint_steps(total, r.checkpoint.save_freq) if total else []
    size = None
    if shape is not None:
        size = checkpoint_size(r.engine, r.backend, shape.params, lora_params_of(spec, shape))
    sched = Schedule(rows, source, per_epoch, total, r.checkpoint.save_freq, ckpts, size)
    if shape is not None:
        sched.step_s, sched.startup_s, sched.step_source = predict_step(spec, shape)
    if sched.step_s:
        budget = r.resources.time_min * 60 - (sched.startup_s if sched.startup_s is not None else STARTUP_S)
        sched.steps_in_time_limit = max(0, math.floor(budget / sched.step_s))
    return sched


def predict_step(spec: RunSpec, shape: ModelShape, exclude_run: str | None = None
                 ) -> tuple[float | None, float | None, str]:
    """(seconds per step, measured start-up or None, the calibration it comes from or ''): scaled by this
    cluster's newest calibration for the engine (not `exclude_run`'s own), else the reference GPU run's model for
    an engine that has one, else (None, None, '')."""
    cal = calibration_of(spec, exclude_run)
    if cal is not None:
        return estimate_step_s(spec, shape) * cal.scale, cal.startup_s, cal.describe()
    if get_engine(spec.recipe.engine).traits.step_time_model and spec.world_size:
        return estimate_step_s(spec, shape), None, ""
    return None, None, ""


def calibration_of(spec: RunSpec, exclude_run: str | None = None) -> Calibration | None:
    """This cluster profile's newest calibration for the engine (runstate.calibration), read from its runs root
    when this machine can see it."""
    from hpc_grpo.common.yamlio import SpecError

    try:
        root = spec.cluster.runs_root_path()
    except SpecError:
        return None
    return newest(root, spec.cluster.name, spec.recipe.engine, exclude_run)


def _advise_save_freq(s: Schedule) -> int:
    """A save_freq that lands a checkpoint before the end and inside the first time limit."""
    assert s.total_steps
    best = s.steps_per_epoch or s.total_steps // 2
    best = min(best, max(1, s.total_steps // 2))
    if s.steps_in_time_limit:
        best = min(best, max(1, int(s.steps_in_time_limit * 0.8)))
    return max(1, best)


def schedule_findings(s: Schedule, key: str = "checkpoint.save_freq") -> list[Finding]:
    out: list[Finding] = []
    if s.total_steps is None:
        out.append(warning("train.total_epochs", f"total steps unknown: {s.rows_source}",
                           "set data.train_rows (the data set's row count) or train.total_training_steps"))
        return out
    if s.total_steps == 0:
        out.append(warning("batch.train", f"{s.rows} rows give 0 steps per epoch at batch.train (verl drops the last "
                           "partial batch)", "use a smaller batch.train or more data"))
        return out
    size = f"; ~{s.size.gib:.1f} GiB each" if s.size else ""
    out.append(info("schedule", f"{s.total_steps} steps ({s.rows_source}); checkpoints at steps "
                    f"{_steps_text(s.checkpoint_steps)}{size}"))
    before_end = [c for c in s.checkpoint_steps if c < s.total_steps]
    if not before_end and s.total_steps > 1:
        out.append(warning(key, f"save_freq {s.save_freq} >= the run's {s.total_steps} steps: the only checkpoint is the "
                           "last step's, so a time limit, preemption or crash before the end loses the whole run",
                           f"use checkpoint.save_freq={_advise_save_freq(s)}"))
    if s.steps_in_time_limit is not None and s.step_s is not None and s.steps_in_time_limit < s.total_steps:
        first = s.checkpoint_steps[0] if s.checkpoint_steps else None
        if first is not None and first > s.steps_in_time_limit:
            out.append(warning(key, f"the first checkpoint (step {first}) lands after the first time limit: at "
                               f"~{s.step_s:.0f} s/step (rough) about {s.steps_in_time_limit} steps fit in "
                               "resources.time, so the requeued job restarts from step 0",
                               f"use checkpoint.save_freq={_advise_save_freq(s)} or a longer resources.time"))
    return out


def _steps_text(steps: list[int]) -> str:
    if len(steps) <= 8:
        return ", ".join(map(str, steps))
    return ", ".join(map(str, steps[:3])) + f", ... ({len(steps)} in all), " + ", ".join(map(str, steps[-2:]))
