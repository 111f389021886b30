"""What a run will cost before it is queued: wall time and GPU-hours (steps x the step-time model x the GPUs, plus
the start-up, plus the eval job's share) and the checkpoint disk over the run, each with where its figure comes from;
and `--budget-gpu-hours`, which refuses a run (or a sweep) predicted over budget. A sweep's cost is the sum of its
members' (the upper bound: every member to its last step) and, with successive halving, its expected cost: past
each rung only the top 1/eta go on.

The step time is planning.schedule's model: scaled by the cluster's own calibration where its runs root holds one
(a finished run's measured step time and start-up, `report RUN --calibrate`), else calibrated on one reference GPU
run (its docstring) and, on other GPUs, scaled by a rough speed table, and the figure says so. An engine without a step-time model (trl) has no
prediction; a job without GPUs costs no GPU-hours. The eval job has no time model: its share is an upper bound,
its GPUs for its whole time limit. Stdlib only.
"""

from __future__ import annotations

from dataclasses import dataclass

from hpc_grpo.common.yamlio import SpecError
from hpc_grpo.config.spec import RunSpec

CALIBRATION = ("a GRPO-LoRA run of Qwen2.5-3B-Instruct on 4x A100 (docs/benchmarks.md, \"Reference GPU run\"); "
               "rough, tens of percent")


@dataclass(frozen=True, slots=True)
class Cost:
    steps: int | None
    step_s: float | None
    startup_s: float
    gpus: int  # the training job's GPUs (nodes x GPUs per node)
    eval_gpus: int
    eval_limit_s: float  # the eval job's time limit: the upper bound of its share
    ckpt_gib: float | None  # one checkpoint
    ckpts_written: int
    ckpts_kept: int  # the most kept at once (keep_last, and every multiple of keep_every)
    source: str  # where the step time comes from, or why there is none

    @property
    def wall_s(self) -> float | None:
        """Predicted training wall time (start-up once; a requeue's start-up again is not counted)."""
        if self.steps is None or self.step_s is None:
            return None
        return self.startup_s + self.steps * self.step_s

    @property
    def train_gpu_hours(self) -> float | None:
        if self.gpus == 0:
            return 0.0
        wall = self.wall_s
        return None if wall is None else wall * self.gpus / 3600

    @property
    def eval_gpu_hours(self) -> float:
        return self.eval_gpus * self.eval_limit_s / 3600

    @property
    def gpu_hours(self) -> float | None:
        """Training's prediction plus the eval job's upper bound; None when training's is unknown."""
        train = self.train_gpu_hours
        return None if train is None else train + self.eval_gpu_hours

    @property
    def disk_peak_gib(self) -> float | None:
        return None if self.ckpt_gib is None else self.ckpt_gib * self.ckpts_kept

    @property
    def disk_written_gib(self) -> float | None:
        return None if self.ckpt_gib is None else self.ckpt_gib * self.ckpts_written

    def describe(self) -> str:
        wall, gh = self.wall_s, self.gpu_hours
        timing = "" if wall is None else (f"~{_duration(wall)} wall ({self.steps} steps x ~{self.step_s:.3g} s + "
                                          f"{_duration(self.startup_s)} start-up), ")
        if gh is None:
            head = f"no prediction ({self.source})"
        elif self.gpus == 0 and self.eval_gpus == 0:
            head = f"{timing}no GPU-hours (a CPU job)" + (f"; step time from {self.source}" if timing else "")
        else:
            head = (f"{timing}~{gh:.1f} GPU-hours on {self.gpus} GPU(s), the eval job's up to "
                    f"{self.eval_gpu_hours:.1f} included; step time from {self.source}")
        disk = ("" if self.disk_peak_gib is None else
                f"; checkpoints: {self.ckpts_written} written ({self.disk_written_gib:.1f} GiB in all), at most "
                f"{self.ckpts_kept} kept at once ({self.disk_peak_gib:.1f} GiB)")
        return head + disk

    def as_dict(self) -> dict[str, object]:
        return {"steps": self.steps, "step_s": self.step_s, "wall_s": self.wall_s, "gpus": self.gpus,
                "gpu_hours": self.gpu_hours, "train_gpu_hours": self.train_gpu_hours,
                "eval_gpu_hours_max": self.eval_gpu_hours, "checkpoint_gib": self.ckpt_gib,
                "checkpoints_written": self.ckpts_written, "checkpoints_kept_max": self.ckpts_kept,
                "disk_peak_gib": self.disk_peak_gib, "disk_written_gib": self.disk_written_gib, "source": self.source}


def _duration(seconds: float) -> str:
    """Hours for a run, minutes for a short one, seconds for a demo."""
    if seconds >= 3600:
        return f"{seconds / 3600:.2f} h"
    return f"{seconds / 60:.0f} min" if seconds >= 120 else f"{seconds:.0f} s"


def step_time_source(spec: RunSpec) -> str:
    from hpc_grpo.planning.schedule import GPU_SPEED

    gpu = (spec.cluster.gpu_type or "").lower()
    if gpu == "a100":
        return CALIBRATION
    scaled = f"scaled x{GPU_SPEED[gpu]:g} for {gpu}" if gpu in GPU_SPEED else \
        f"this cluster's GPU type ({spec.cluster.gpu_type or 'unset'}) taken as an A100"
    return f"{CALIBRATION}; calibrated on other hardware, {scaled}"


def run_cost(spec: RunSpec, schedule: object | None) -> Cost:
    """The run's cost from its schedule (planning.schedule.Schedule) and its eval job's placement."""
    from hpc_grpo.evaluation.evaluate import eval_spec
    from hpc_grpo.planning.schedule import STARTUP_S

    steps = getattr(schedule, "total_steps", None)
    step_s = getattr(schedule, "step_s", None)
    ckpts: list[int] = list(getattr(schedule, "checkpoint_steps", []) or [])
    size = getattr(schedule, "size", None)
    ck = spec.recipe.checkpoint
    every = [s for s in ckpts if ck.keep_every and s % ck.keep_every == 0]
    kept = min(len(ckpts), ck.keep_last + len(every)) if ckpts else 0
    gpus = spec.recipe.resources.nodes * spec.gpus_per_node
    calibrated = str(getattr(schedule, "step_source", ""))
    if calibrated:
        source = calibrated
    elif gpus == 0:
        source = "no GPUs: a CPU job costs no GPU-hours"
    elif step_s is None:
        source = f"no step-time model for the {spec.recipe.engine} engine: time a short run to know"
    else:
        source = step_time_source(spec)
    try:
        e = eval_spec(spec) if spec.recipe.eval.runs else None
    except SpecError:
        e = None  # an eval placement plan refuses (its own finding says why): no share to count
    eval_gpus = e.gpus_per_node if e is not None else 0
    eval_s = float(e.recipe.resources.time_min * 60) if e is not None else 0.0
    measured_startup = getattr(schedule, "startup_s", None)
    startup = float(measured_startup) if measured_startup is not None else float(STARTUP_S)
    return Cost(steps, step_s, startup if step_s else 0.0, gpus, eval_gpus, eval_s,
                None if size is None else size.gib, len(ckpts), kept, source)


def going_on(members: int, eta: int, rungs_passed: int) -> float:
    """The expected number of members still training after `rungs_passed` rungs of successive halving: members /
    eta^k, at least one (a rung always lets the best member go on; ASHA's first member at a rung goes on too, so the
    count is a little higher where members reach a rung far apart)."""
    return max(members / eta ** rungs_passed, 1.0) if members else 0.0


def halving_segments(steps: int, rungs: list[int]) -> list[tuple[int, int]]:
    """The step spans between rungs: (0, r1), (r1, r2), ..., (rk, steps); rungs at or past the last step dropped."""
    bounds = [0, *sorted(r for r in set(rungs) if 0 < r < steps), steps]
    return list(zip(bounds[:-1], bounds[1:]))


@dataclass(frozen=True, slots=True)
class SweepCost:
    """A sweep's GPU-hours: the upper bound (every member to its last step) and, with successive halving at `rungs`
    keeping the top 1/`eta`, the expected: every member pays its start-up and its steps to the first rung, and past
    the k-th rung only going_on(N, eta, k) of the N members train on (each member equally likely to be one)."""

    members: list[tuple[str, Cost]]
    rungs: list[int]
    eta: int

    @property
    def upper_bound(self) -> float | None:
        known = [c.gpu_hours for _, c in self.members]
        return None if any(g is None for g in known) else sum(g or 0.0 for g in known)

    def survivors(self) -> list[float]:
        """Members training in each span between rungs (N before the first rung, then N / eta^k, at least 1)."""
        n = len(self.members)
        return [going_on(n, self.eta, k) for k in range(len(self.rungs) + 1)]

    @property
    def expected(self) -> float | None:
        """The expected GPU-hours with halving; the upper bound without rungs."""
        if not self.rungs:
            return self.upper_bound
        n = len(self.members)
        total = 0.0
        for _, cost in self.members:
            if cost.gpu_hours is None:
                return None
            steps = cost.steps or 0
            passed = [r for r in sorted(set(self.rungs)) if 0 < r < steps] if cost.steps else []
            share = [going_on(n, self.eta, k) / n for k in range(len(passed) + 1)]
            if cost.gpus == 0 or cost.step_s is None:  # a CPU job's training costs no GPU-hours
                total += share[-1] * cost.eval_gpu_hours
                continue
            spans = halving_segments(steps, self.rungs)
            steps_paid = sum(p * (b - a) for p, (a, b) in zip(share, spans))
            total += (cost.startup_s + steps_paid * cost.step_s) * cost.gpus / 3600 + share[-1] * cost.eval_gpu_hours
        return total

    def describe(self) -> str:
        """The upper bound, and the expected with halving beside it; where the step time comes from."""
        source = self.members[0][1].source if self.members else ""
        upper = self.upper_bound
        if upper is None:
            return f"no prediction ({source})"
        if all(c.gpus == 0 and c.eval_gpus == 0 for _, c in self.members):
            return "no GPU-hours (CPU jobs)" + (f"; successive halving at steps {', '.join(map(str, self.rungs))} "
                                                f"(eta {self.eta}): members training past each rung: "
                                                f"{self._counts()}" if self.rungs else "")
        line = f"~{upper:.1f} GPU-hours, every member to its last step (the upper bound)"
        if self.rungs:
            line += (f"; expected with successive halving at steps {', '.join(map(str, self.rungs))} (eta "
                     f"{self.eta}): ~{self.expected:.1f} GPU-hours (members training past each rung: {self._counts()}; "
                     "only the members that train to the end run their eval job)")
        return line + f"; step time from {source}"

    def _counts(self) -> str:
        return " -> ".join(f"{c:.3g}" for c in self.survivors())

    def as_dict(self) -> dict[str, object]:
        return {"upper_bound_gpu_hours": self.upper_bound, "expected_gpu_hours": self.expected,
                "rungs": self.rungs, "eta": self.eta, "members_going_on": self.survivors(),
                "budget_checks": BUDGET_FIGURE}


# which figure --budget-gpu-hours compares for a sweep, said by `sweep` and in its refusal
BUDGET_FIGURE = "the upper bound (every member to its last step): halving's expected cost is an estimate, not a limit"


def check_budget(costs: list[tuple[str, Cost]], budget: float, what: str = "the run",
                 expected: float | None = None) -> None:
    """SpecError (exit 2) when the predicted GPU-hours of `costs` (one per run or sweep member) exceed `budget`, or
    cannot be predicted: naming the figure, where it comes from, and the fix. A sweep is checked by its upper bound
    (BUDGET_FIGURE); `expected` (its cost with successive halving) is only said beside it."""
    unknown = [name for name, c in costs if c.gpu_hours is None]
    if unknown:
        raise SpecError(f"{what} cannot be checked against --budget-gpu-hours {budget:g}: {costs[0][1].source} "
                        f"({', '.join(unknown)}). Drop --budget-gpu-hours, or use an engine with a step-time model",
                        key="--budget-gpu-hours")
    total = sum(c.gpu_hours or 0.0 for _, c in costs)
    if total > budget:
        each = "" if len(costs) == 1 else (f", the upper bound ({len(costs)} members, each to its last step, "
                                           f"{max(c.gpu_hours or 0 for _, c in costs):.1f} at most each)")
        halving = ("" if expected is None else f"; with successive halving ~{expected:.1f} are expected, an estimate "
                   "that the budget is not checked against")
        raise SpecError(f"{what} is predicted at {total:.1f} GPU-hours{each}, over --budget-gpu-hours {budget:g} "
                        f"(step time from {costs[0][1].source}; the eval job counted at its whole time limit{halving}). "
                        "Fix: fewer steps (train.total_training_steps), fewer members, or a larger budget",
                        key="--budget-gpu-hours")
