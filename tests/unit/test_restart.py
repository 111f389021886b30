"""The requeue decision (hpc_grpo.runstate.restart): cause -> requeue or not, the time-limit count, chained starts,
the new recipe/cluster fields and what submit refuses. Pure logic: no Slurm, no training."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpc_grpo.launch import render
from hpc_grpo.runstate import restart, runs
from hpc_grpo.config.resolve import resolve_spec
from hpc_grpo.common.yamlio import SpecError


def spec_for(tmp_path: Path, *overrides: str, cluster: str = "slurm-dev"):
    return resolve_spec("tiny-gsm8k", cluster, overrides=[f"cluster.runs_root={tmp_path}", *overrides],
                        run_name="r")


@pytest.mark.parametrize("time_left,delay,cause", [
    (30, 30, restart.TIME_LIMIT),          # on time
    (90, 30, restart.TIME_LIMIT),          # Slurm sends the warning up to 60 s early
    (120, 30, restart.TIME_LIMIT),         # ... plus the slack
    (121, 30, restart.PREEMPTION),         # more time left than any warning: preemption or scancel --signal
    (3600, 120, restart.PREEMPTION),
    (None, 30, restart.TIME_LIMIT),        # unknown: the bounded case
])
def test_classify_signal(time_left: int | None, delay: int, cause: str) -> None:
    assert restart.classify_signal(time_left, delay) == cause


@pytest.mark.parametrize("cause,timeouts,limit,requeue", [
    (restart.TIME_LIMIT, 0, 3, True),
    (restart.TIME_LIMIT, 2, 3, True),
    (restart.TIME_LIMIT, 3, 3, False),     # the 4th time limit stops the run
    (restart.TIME_LIMIT, 0, 0, False),     # max_timeout_requeues=0: never requeued on a time limit
    (restart.PREEMPTION, 50, 3, True),     # preemptions without limit
    (restart.NODE_FAILURE, 50, 0, True),
    ("predecessor FAILED", 0, 3, False),   # any other cause: not requeued
])
def test_decide(cause: str, timeouts: int, limit: int, requeue: bool) -> None:
    d = restart.decide(cause, timeouts, limit)
    assert d.requeue is requeue
    assert d.reason.startswith(cause)
    if cause == restart.TIME_LIMIT and not requeue:
        assert f"resources.max_timeout_requeues={limit}" in d.reason and "hpc-grpo resume" in d.reason


def test_time_limits_are_counted_from_the_history(tmp_path: Path) -> None:
    spec = spec_for(tmp_path, "resources.max_timeout_requeues=2")
    run = spec.path
    run.mkdir(parents=True)
    runs.append_history(run, "10", "train", "slurm")
    for _ in range(5):  # preemptions are recorded but never counted
        d = restart.decide_for_run(run, spec, time_left_s=3000)
        assert d.requeue and d.cause == restart.PREEMPTION
        runs.append_history(run, "10", "requeue", "slurm", note=d.reason)
    for n in (1, 2):
        d = restart.decide_for_run(run, spec, time_left_s=20)
        assert d.requeue and d.reason.startswith(f"time limit: requeue {n} of at most 2"), d.reason
        runs.append_history(run, "10", "requeue", "slurm", note=d.reason)
    assert restart.timeouts_so_far(runs.read_history(run)) == 2
    d = restart.decide_for_run(run, spec, time_left_s=20)
    assert not d.requeue and "reached 3 times" in d.reason


@pytest.mark.parametrize("state,timeouts,go", [
    ("TIMEOUT", 0, True), ("PREEMPTED", 9, True), ("NODE_FAIL", 9, True), ("TIMEOUT", 3, False),
    ("FAILED", 0, False), ("CANCELLED", 0, False), ("OUT_OF_MEMORY", 0, False), ("COMPLETED", 0, False),
    (None, 0, False),
])
def test_chained_start(state: str | None, timeouts: int, go: bool) -> None:
    d = restart.chained_start(state, timeouts, 3)
    assert d.requeue is go
    if state in ("FAILED", "CANCELLED", None):
        assert f"predecessor ended {state or 'UNKNOWN'}: nothing to resume" in d.reason


def test_new_fields_are_validated(tmp_path: Path) -> None:
    assert spec_for(tmp_path).recipe.resources.max_timeout_requeues == 3
    assert spec_for(tmp_path).cluster.restart == "requeue"
    with pytest.raises(SpecError, match="max_timeout_requeues"):
        spec_for(tmp_path, "resources.max_timeout_requeues=-1")
    with pytest.raises(SpecError, match="restart"):
        spec_for(tmp_path, "cluster.restart=sometimes")


def test_submit_refuses_impossible_restart_settings(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="signal_delay_s=120 is not shorter than resources.time=2"):
        restart.check(spec_for(tmp_path, "resources.time=2", "cluster.signal_delay_s=120"))
    with pytest.raises(SpecError, match="restart=chain needs a Slurm cluster"):
        restart.check(spec_for(tmp_path, "cluster.restart=chain", cluster="local"))
    restart.check(spec_for(tmp_path, "resources.time=2", "cluster.signal_delay_s=60", "cluster.restart=chain"))


def test_chained_mode_renders_no_requeue_and_the_dependency(tmp_path: Path) -> None:
    plain = render.render_sbatch(spec_for(tmp_path))
    assert "#SBATCH --requeue\n" in plain and "--no-requeue" not in plain
    spec = spec_for(tmp_path, "cluster.restart=chain")
    chained = render.render_sbatch(spec, extra=[("dependency", "afternotok:41"), ("kill-on-invalid-dep", "yes")])
    assert "#SBATCH --no-requeue\n" in chained and "#SBATCH --requeue\n" not in chained
    assert "#SBATCH --dependency=afternotok:41\n#SBATCH --kill-on-invalid-dep=yes\n" in chained
