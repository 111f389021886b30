"""Live monitoring of a run: progress, the latest training numbers, health hints, GPU use per node, logs.

The numbers come from the engine's own output through hpc_grpo.runstate.metrics (metrics.jsonl: trl's rows or
verl's file-logger rows; else verl's console metric lines in the driver's log). Health hints restate what healthy training
looks like for the recipe (its `health` section: by default the reference GPU run of docs/benchmarks.md, reward
rising ~0.55 -> ~0.90, KL rising but bounded at ~0.0027, grad norm smooth, responses not at the length limit; a demo
declares its own KL scale and that its answers are meant to reach the limit) and a badly laid-out job's symptom
(GPU use under 50%), so a user sees the problem while the job runs.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from hpc_grpo.runstate import layout, runs
from hpc_grpo.runstate import metrics as engine_metrics
from hpc_grpo.config.engine_traits import traits_of
from hpc_grpo.config.spec import RunSpec
from hpc_grpo.config.steps import total_steps
from hpc_grpo.runstate.health import run_health

GPU_FIELDS = "index,name,utilization.gpu,memory.used,memory.total"
# KL hints, as multiples of the recipe's healthy KL (health.kl, by default the reference GPU run's 0.0027): "far
# above" at 0.1 for that run, and a steady rise counts once it passes 0.01 there.
KL_TOO_HIGH_X = 0.1 / 0.0027
KL_RISING_X = 0.01 / 0.0027
GPU_IDLE_PCT = 50  # a badly laid-out job's symptom: "GPU use under 50%"


@dataclass
class Progress:
    step: int | None
    total: int | None
    total_estimated: bool
    step_time_s: float | None
    eta_s: float | None
    requeues: int


@dataclass
class Monitor:
    progress: Progress
    latest: dict[str, Any] = field(default_factory=dict)
    hints: list[str] = field(default_factory=list)
    source: str = ""
    reward_note: str = ""  # the recipe's health.reward_note: what its reward means (a demo's)

    def as_dict(self) -> dict[str, Any]:
        return {"progress": asdict(self.progress), "latest": self.latest, "hints": self.hints, "source": self.source,
                "reward_note": self.reward_note}


# A mean response length at this share of data.max_response_length counts as "at the limit" (answers cut off).
AT_LIMIT_SHARE = 0.95


# ------------------------------------------------------------------------------------------------------- logs

def log_path(spec: RunSpec, job_id: str, node: int = 0, err: bool = False) -> Path:
    """One node's log of a job: task N runs on node N (one task per node); node 0's is the driver's."""
    return layout.job_log(spec.path, job_id, int(node), err)


def newest_job(run_dir: Path) -> str | None:
    ids = runs.job_ids(run_dir)
    return ids[-1] if ids else None


# ---------------------------------------------------------------------------------------------------- metrics
def read_rows(spec: RunSpec) -> tuple[list[dict[str, Any]], int | None, str]:
    """(rows, total steps the engine printed or None, where the rows came from): hpc_grpo.runstate.metrics reads
    metrics.jsonl, else (verl) every allocation's driver log, oldest first."""
    on_console = traits_of(spec.recipe.engine).metrics_on_console
    logs = [log_path(spec, j) for j in runs.job_ids(spec.path)] if on_console else []
    got = engine_metrics.run_metrics(spec.path, logs)
    return got.rows, got.total, got.source or str(layout.metrics_file(spec.path))


def step_time(rows: list[dict[str, Any]]) -> float | None:
    """Median seconds per step over the last 10 steps: the engine's own step time, else the log times' spacing."""
    logged = [r["step_time"] for r in rows[-10:] if r.get("step_time")]
    if logged:
        return float(statistics.median(logged))
    timed = [(r["step"], r["time"]) for r in rows[-11:] if r.get("time")]
    gaps = [(t1 - t0) / (s1 - s0) for (s0, t0), (s1, t1) in zip(timed, timed[1:]) if s1 > s0]
    return float(statistics.median(gaps)) if gaps else None


def progress_of(spec: RunSpec, rows: list[dict[str, Any]], printed_total: int | None) -> Progress:
    step = rows[-1]["step"] if rows else None
    total, estimated = total_steps(spec, printed_total)
    per = step_time(rows)
    eta = per * max(0, total - step) if (per is not None and total is not None and step is not None) else None
    requeues = sum(1 for e in runs.read_history(spec.path) if e.purpose == "requeue")
    return Progress(step, total, estimated, per, eta, requeues)


def health_hints(spec: RunSpec, rows: list[dict[str, Any]]) -> list[str]:
    """Where the numbers leave the reference GPU run's healthy ranges; empty when they do not (or too few steps)."""
    hints: list[str] = []

    def series(key: str) -> list[float]:
        return [r[key] for r in rows if isinstance(r.get(key), (int, float))]

    healthy = spec.recipe.health
    kl = series("kl")
    if kl and kl[-1] > KL_TOO_HIGH_X * healthy.kl:
        hints.append(f"KL {kl[-1]:.4g} is far above this recipe's healthy ~{healthy.kl:g} (health.kl; rising but "
                     "bounded): the policy is drifting from the reference; lower grpo.lr or raise grpo.kl_coef")
    elif (len(kl) >= 6 and all(b > a for a, b in zip(kl[-6:], kl[-5:])) and kl[-1] > KL_RISING_X * healthy.kl
          and kl[-1] > 2 * kl[-6]):
        hints.append(f"KL has risen for 5 logged steps in a row, {kl[-6]:.4g} -> {kl[-1]:.4g}, without levelling off: "
                     "watch for divergence (lower grpo.lr or raise grpo.kl_coef)")
    reward = series("reward")
    if len(reward) >= 5:
        best, recent = max(reward), statistics.mean(reward[-3:])
        if best > 0.1 and recent < 0.5 * best:
            hints.append(f"reward collapsing: the last steps average {recent:.3g}, the best was {best:.3g} (in a healthy run "
                         "it rises steadily); resume from the checkpoint before the fall with a lower grpo.lr")
    grad = series("grad_norm")
    if len(grad) >= 6:
        typical = statistics.median(grad[:-1])
        if typical > 0 and grad[-1] > 10 * typical:
            hints.append(f"grad norm spiked to {grad[-1]:.3g}, {grad[-1] / typical:.0f}x its median {typical:.3g} "
                         "(in a healthy run it stays smooth): a sign of divergence")
    limit = spec.recipe.data.max_response_length
    length = series("response_length")
    clip = series("response_clip_ratio")
    at_limit = (clip and clip[-1] >= 0.5) or (length and length[-1] >= AT_LIMIT_SHARE * limit)
    if at_limit and not healthy.length_limit_by_design:
        what = f"{clip[-1]:.0%} of responses" if clip and clip[-1] >= 0.5 else f"mean response length {length[-1]:.0f}"
        hints.append(f"{what} at the limit data.max_response_length={limit}: answers are cut off before they end "
                     "(reward is lost); raise data.max_response_length or check the prompt format")
    return [h.message for h in run_health(rows)] + hints


def monitor(spec: RunSpec) -> Monitor:
    rows, printed, source = read_rows(spec)
    latest = {k: v for k, v in (rows[-1] if rows else {}).items() if k != "time"}
    return Monitor(progress_of(spec, rows, printed), latest, health_hints(spec, rows), source,
                   spec.recipe.health.reward_note)


def bar(step: int | None, total: int | None, width: int = 30) -> str:
    """`[##########--------------------]  8/24  33%` (no total: the step alone)."""
    if step is None:
        return "no step logged yet"
    if not total:
        return f"step {step}"
    done = min(width, round(width * step / total))
    return f"[{'#' * done}{'-' * (width - done)}] {step}/{total} {min(100, round(100 * step / total))}%"


def duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    s = int(round(seconds))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


# -------------------------------------------------------------------------------------------------------- GPUs
@dataclass(frozen=True, slots=True)
class GpuRow:
    node: str
    index: int
    name: str
    util_pct: float
    mem_used_mib: float
    mem_total_mib: float


def parse_gpu_rows(text: str) -> list[GpuRow]:
    """Rows of `NODE, index, name, utilization.gpu, memory.used, memory.total` (nvidia-smi csv, noheader, nounits)."""
    out = []
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) < 6:
            continue
        node, index, *name, util, used, total = parts
        try:
            out.append(GpuRow(node, int(index), ", ".join(name), float(util), float(used), float(total)))
        except ValueError:
            continue  # "[N/A]" from a GPU that does not report
    return sorted(out, key=lambda g: (g.node, g.index))


def running_job(run_dir: Path) -> str | None:
    """The run's Slurm job that is RUNNING now (the newest one if several)."""
    from hpc_grpo.cluster import slurm

    ids = [e.job_id for e in runs.read_history(run_dir) if e.executor == "slurm"]
    states = slurm.job_states(list(dict.fromkeys(ids))) if ids else {}
    running = [j for j in dict.fromkeys(ids) if states.get(j) and states[j].state == "RUNNING"]
    return running[-1] if running else None


def gpu_usage(spec: RunSpec) -> tuple[str, list[GpuRow]]:
    """(job id, one row per GPU of every node of the running job), through `srun --overlap --jobid`."""
    from hpc_grpo.cluster import slurm
    from hpc_grpo.common.yamlio import SpecError

    if spec.cluster.scheduler != "slurm":
        raise SpecError(f"run {spec.run_name} is on cluster '{spec.cluster.name}' (no Slurm): run nvidia-smi here",
                        key="--gpus")
    job = running_job(spec.path)
    if job is None:
        raise SpecError(f"run {spec.run_name} has no running job: --gpus needs one", key="--gpus")
    return job, parse_gpu_rows(slurm.gpu_query(job, GPU_FIELDS, spec.recipe.resources.nodes))


def gpu_hints(rows: list[GpuRow]) -> list[str]:
    idle = [g for g in rows if g.util_pct < GPU_IDLE_PCT]
    if not rows or not idle:
        return []
    names = ", ".join(f"{g.node}:{g.index}" for g in idle)
    return [f"{len(idle)} of {len(rows)} GPUs under {GPU_IDLE_PCT}% busy ({names}): the symptom of a badly laid-out job. "
            "A sawtooth (low in rollout, ~100% in the update) is normal; GPUs low in every sample are not: check "
            "parallel.rollout_tp (TP 1 is enough for a 3B model) and batch sizes"]
