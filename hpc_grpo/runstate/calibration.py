"""The step-time model's calibration from the user's own runs: what a finished run measured (median step time,
start-up), kept per cluster profile in a file under the cluster's runs root, which `plan` reads.

`hpc-grpo report RUN --calibrate` records one line; plan scales its two-term step-time model
(planning.schedule.estimate_step_s) by measured / modelled of the newest line of the same cluster and engine, so a
run of another size, batch or group on the same hardware is predicted from this hardware's speed, not the
reference GPU run's. The file is JSON lines (append-only, one writer at a time is all it needs: O_APPEND).
Stdlib only: plan reads it.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from dataclasses import asdict, dataclass
from datetime import datetime
from pathlib import Path

from hpc_grpo.runstate import layout
from hpc_grpo.runstate.metrics import run_metrics
from hpc_grpo.runstate.runs import read_history


@dataclass(frozen=True, slots=True)
class Timing:
    """What one run measured: the median seconds per step, the start-up (from its first job's start to the end of
    its first step, less one median step; None when the rows carry no clock, as verl's file logger's), the
    training wall time and the steps it logged."""

    step_s: float
    startup_s: float | None
    wall_s: float | None
    steps: int


@dataclass(frozen=True, slots=True)
class Calibration:
    """One calibration line: a run's measured timing beside what the uncalibrated model said for it."""

    cluster: str
    engine: str
    run: str
    when: str
    step_s: float
    startup_s: float | None
    model_step_s: float  # planning.schedule.estimate_step_s of the run's own spec, uncalibrated

    @property
    def scale(self) -> float:
        return self.step_s / self.model_step_s

    def describe(self) -> str:
        return (f"this cluster's calibration: run {self.run} ({self.engine}, {self.step_s:.3g} s/step measured, "
                f"{self.when})")


def _start_time(run_dir: Path) -> float | None:
    """The first job's start in the run's history (epoch seconds)."""
    for e in read_history(run_dir):
        if e.purpose == "start":
            try:
                return datetime.strptime(e.time, "%Y-%m-%dT%H:%M:%S%z").timestamp()
            except ValueError:
                return None
    return None


def measure(run_dir: Path) -> Timing | None:
    """The run's timing from its metrics rows (step_time per step, the rows' clock) and its history's first start;
    None when no step logged a step time."""
    rows = run_metrics(run_dir, layout.driver_logs(run_dir)).rows
    times = [float(r["step_time"]) for r in rows if isinstance(r.get("step_time"), (int, float))]
    if not times:
        return None
    step_s = statistics.median(times)
    start = _start_time(run_dir)
    clocked = [r for r in rows if isinstance(r.get("time"), (int, float))]
    startup = wall = None
    if start is not None and clocked:
        # everything before the first step at the median pace is start-up: a slow first step (warm-up, compile)
        # is a cost every run pays once
        first, last = clocked[0], clocked[-1]
        startup = max(0.0, float(first["time"]) - start - step_s)
        wall = max(0.0, float(last["time"]) - start)
    return Timing(step_s, startup, wall, len(times))


def record(runs_root: Path, cal: Calibration) -> Path:
    """Append one calibration line under the runs root."""
    path = layout.calibration_file(runs_root)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (json.dumps(asdict(cal)) + "\n").encode())
    finally:
        os.close(fd)
    return path


def newest(runs_root: Path, cluster: str, engine: str, exclude_run: str | None = None) -> Calibration | None:
    """The newest usable line for this cluster profile and engine (not from `exclude_run`: a run is not predicted
    from itself); None when there is none (or no file)."""
    try:
        lines = layout.calibration_file(runs_root).read_text(encoding="utf-8").splitlines()
    except OSError:
        return None
    for line in reversed(lines):
        try:
            cal = Calibration(**json.loads(line))
        except (ValueError, TypeError):
            continue  # a torn or foreign line: the next older one serves
        if (cal.cluster, cal.engine) == (cluster, engine) and cal.run != exclude_run and cal.step_s > 0 \
                and cal.model_step_s > 0:
            return cal
    return None


def today() -> str:
    return time.strftime("%Y-%m-%d")
