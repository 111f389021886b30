"""The step-time model calibrated from the user's own runs (runstate.calibration, commands.run_timing): what a run
measured, the line `report --calibrate` records per cluster profile and engine, and plan's prediction from it."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from hpc_grpo.common.yamlio import SpecError
from hpc_grpo.config.models import resolve_shape
from hpc_grpo.config.resolve import resolve_spec
from hpc_grpo.planning.cost import run_cost
from hpc_grpo.planning.schedule import estimate_step_s, make_schedule
from hpc_grpo.runstate import calibration, layout
from hpc_grpo.runstate.calibration import Calibration

MODEL = "model.path=Qwen/Qwen2.5-0.5B-Instruct"  # a shape from the table: no model folder needed


def fake_run(runs_root: Path, name: str, step_times: list[float], start: float, first_end: float) -> Path:
    """A run directory as a trl job leaves it: its history's start line and one metrics row per step (with the
    row's clock), steps ending step_times apart from first_end on."""
    run = runs_root / name
    run.mkdir(parents=True)
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(start))
    layout.history_file(run).write_text(json.dumps({"job_id": "1", "purpose": "start", "executor": "local",
                                                    "time": stamp, "note": ""}) + "\n")
    rows, clock = [], first_end
    for i, st in enumerate(step_times, 1):
        clock += 0 if i == 1 else st
        rows.append(json.dumps({"step": i, "reward": 0.1, "step_time": st, "time": clock}))
    layout.metrics_file(run).write_text("\n".join(rows) + "\n")
    return run


def test_measure_takes_the_median_step_and_counts_a_slow_first_step_as_start_up(tmp_path: Path) -> None:
    start = float(int(time.time()))
    run = fake_run(tmp_path, "r", [40.0, 5.0, 6.0, 5.0, 7.0], start, start + 60.0)
    t = calibration.measure(run)
    assert t is not None and t.step_s == 6.0 and t.steps == 5
    assert t.startup_s == pytest.approx(60.0 - 6.0)  # the first step's end, less one median step
    assert t.wall_s == pytest.approx(60.0 + 5 + 6 + 5 + 7)


def test_no_step_time_no_measure(tmp_path: Path) -> None:
    run = tmp_path / "r"
    run.mkdir()
    layout.metrics_file(run).write_text(json.dumps({"step": 1, "reward": 0.1}) + "\n")
    assert calibration.measure(run) is None


def line(run: str, cluster: str = "local", engine: str = "trl", step_s: float = 2.0) -> Calibration:
    return Calibration(cluster, engine, run, "2026-12-06", step_s, 30.0, 1.0)


def test_newest_line_of_the_cluster_and_engine_not_the_runs_own(tmp_path: Path) -> None:
    for cal in (line("old", step_s=4.0), line("other-cluster", cluster="a100-ib"), line("verl", engine="verl"),
                line("new", step_s=3.0)):
        calibration.record(tmp_path, cal)
    with layout.calibration_file(tmp_path).open("a") as f:
        f.write('{"cluster": "local", "engine": "trl", "run": "torn"\n')  # a torn last line: skipped
    assert calibration.newest(tmp_path, "local", "trl").run == "new"
    assert calibration.newest(tmp_path, "local", "trl", exclude_run="new").run == "old"
    assert calibration.newest(tmp_path, "a100-ib", "trl").run == "other-cluster"
    assert calibration.newest(tmp_path, "h100-roce", "trl") is None
    assert calibration.newest(tmp_path / "missing", "local", "trl") is None


def test_plan_scales_the_model_by_this_clusters_calibration(tmp_path: Path) -> None:
    root = f"cluster.runs_root={tmp_path}"
    spec = resolve_spec("tiny-gsm8k", "local", [root, MODEL, "train.total_training_steps=10"])
    shape = resolve_shape(spec.recipe.model.path)
    assert shape is not None
    before = run_cost(spec, make_schedule(spec, shape))
    assert before.wall_s is None and "no GPU-hours" in before.describe()  # trl on CPU: no model, no prediction

    # a calibration run at half the batch measured 2 s/step where the model said 0.5 s
    half = resolve_spec("tiny-gsm8k", "local", [root, MODEL, "batch.train=4", "batch.mini=4"])
    modelled = estimate_step_s(half, shape)
    calibration.record(tmp_path, Calibration("local", "trl", "calib", "2026-12-06", 2.0, 25.0, modelled))
    sched = make_schedule(spec, shape)
    assert sched.step_s == pytest.approx(estimate_step_s(spec, shape) * 2.0 / modelled)
    assert sched.step_s > 2.0  # twice the batch: slower than the calibration run's steps
    after = run_cost(spec, sched)
    assert after.wall_s == pytest.approx(25.0 + 10 * sched.step_s)
    assert "this cluster's calibration: run calib" in after.describe() and "no GPU-hours" in after.describe()
    # another cluster profile, or the run itself, is not predicted from it
    other = resolve_spec("tiny-gsm8k", "a100-ib", [root, MODEL, "resources.gpus_per_node=1"])
    assert make_schedule(other, shape).step_s is None


def test_report_sets_predicted_beside_measured_and_calibrate_records(tmp_path: Path) -> None:
    from hpc_grpo.commands.run_timing import calibrate, run_timing
    from hpc_grpo.launch.render import frozen_spec_text

    start = float(int(time.time()))
    run = fake_run(tmp_path, "calib", [9.0, 3.0, 3.0, 3.0], start, start + 40.0)
    spec = resolve_spec("tiny-gsm8k", "local", [f"cluster.runs_root={tmp_path}", MODEL])
    layout.spec_file(run).write_text(frozen_spec_text(spec))
    timing = run_timing(run)
    assert timing is not None and timing.step_s is None  # nothing to predict trl on CPU from yet
    assert "--calibrate" in timing.lines()[0]
    where, cal = calibrate(run)
    assert where == layout.calibration_file(tmp_path) and cal.step_s == 3.0 and cal.startup_s == pytest.approx(37.0)
    assert run_timing(run).step_s is None  # not predicted from its own line
    second = fake_run(tmp_path, "second", [3.0, 3.0], start, start + 40.0)
    layout.spec_file(second).write_text(frozen_spec_text(spec))
    t2 = run_timing(second)
    assert t2 is not None and t2.step_s == pytest.approx(3.0) and t2.startup_s == pytest.approx(37.0)
    assert "x1.00" in t2.lines()[0] and "training wall" in t2.lines()[1]


def test_calibrate_refuses_a_run_without_steps(tmp_path: Path) -> None:
    from hpc_grpo.commands.run_timing import calibrate

    run = tmp_path / "r"
    run.mkdir()
    with pytest.raises(SpecError, match="no step time"):
        calibrate(run)
