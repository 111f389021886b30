"""`hpc-grpo resume` on real run directories (rendered, not submitted): which overrides it takes, the exit-2
messages, a finished run, a live job; and `status`'s restart causes and local elapsed time.
The real resubmission runs in tests/slurm/test_resume.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hpc_grpo.runstate import runs
from hpc_grpo.cluster import slurm_output
from hpc_grpo.commands import status
from hpc_grpo.launch.render import render_all, write_files
from hpc_grpo.config.resolve import resolve_spec
from hpc_grpo.commands.resume import apply_overrides, plan_resume
from hpc_grpo.runstate import layout
from tests import ckpt_trees as trees


@pytest.fixture()
def run(tmp_path: Path) -> Path:
    spec = resolve_spec("tiny-gsm8k", "local", overrides=[f"cluster.runs_root={tmp_path}"], run_name="r")
    write_files(spec.path, render_all(spec))
    return spec.path


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "hpc_grpo.cli.app", *args], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "COLUMNS": "200"})


def untouched(run: Path) -> tuple[str, bool]:
    return (run / "spec.yaml").read_text(), (run / layout.HISTORY_FILE).exists()


def test_other_overrides_are_refused_without_force(run: Path) -> None:
    before = untouched(run)
    proc = cli("resume", str(run), "grpo.lr=0.5")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    text = " ".join(proc.stderr.split())
    for part in ("grpo.lr", "'0.5'", "resources.*", "--force"):
        assert part in text, text
    assert untouched(run) == before


def test_bad_resource_value_names_the_key(run: Path) -> None:
    before = untouched(run)
    proc = cli("resume", str(run), "resources.time=soon")
    assert proc.returncode == 2 and "resources.time" in proc.stderr, proc.stderr
    proc = cli("resume", str(run), "resources.time")
    assert proc.returncode == 2 and "key=value" in proc.stderr, proc.stderr
    assert untouched(run) == before


def test_finished_run_has_nothing_to_resume(run: Path) -> None:
    (run / "train_done.json").write_text(json.dumps({"final_step": 24}))
    proc = cli("resume", str(run))
    assert proc.returncode == 0, proc.stderr
    assert "nothing to resume" in proc.stdout and "--force" in proc.stdout and "step 24" in proc.stdout
    assert not (run / layout.HISTORY_FILE).exists()


def test_live_job_is_refused(run: Path) -> None:
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        runs.append_history(run, str(sleeper.pid), "train", "local")
        proc = cli("resume", str(run), "resources.time=01:00:00")
        assert proc.returncode == 2, proc.stdout + proc.stderr
        assert "already has a live job" in proc.stderr and str(sleeper.pid) in proc.stderr
        assert [e.purpose for e in runs.read_history(run)] == ["train"]
    finally:
        sleeper.kill()
        sleeper.wait()


def test_plan_says_where_it_resumes_and_what_moves(run: Path) -> None:
    trees.trl_checkpoint(run, 4)
    trees.truncate_half(trees.trl_checkpoint(run, 8) / "optimizer.pt")
    plan = plan_resume(run, ["resources.time=00:45:00", "cluster.signal_delay_s=20"], force=False)
    assert plan.step == 4 and plan.spec.recipe.resources.time == "00:45:00" and plan.spec.cluster.signal_delay_s == 20
    lines = plan.describe(force=False)
    assert f"It resumes from {run / 'checkpoints' / 'checkpoint-4'} (step 4)." in lines
    assert any(ln.startswith("At job start, checkpoint-8 moves to") for ln in lines)
    assert plan.spec.overrides[-2:] == ["resources.time=00:45:00", "cluster.signal_delay_s=20"]
    assert (run / "checkpoints" / "checkpoint-8").is_dir()  # planning moves nothing


def test_force_allows_training_overrides(run: Path) -> None:
    spec = plan_resume(run, [], force=False).spec
    new, forced = apply_overrides(spec, ["train.total_training_steps=30", "resources.nodes=1"], force=True)
    assert new.recipe.train.total_training_steps == 30 and forced == ["train.total_training_steps=30"]
    with pytest.raises(Exception, match="run's name and place"):
        apply_overrides(spec, ["run_dir=/elsewhere"], force=True)


# ------------------------------------------------------------------------------------------------ status
SACCT = """\
700|REQUEUED|00:00:41|0:0|node2|None|2026-12-03T07:00:00|2026-12-03T07:00:41
700|PREEMPTED|00:00:20|0:15|node3|None|2026-12-03T07:00:50|2026-12-03T07:01:10
700|TIMEOUT|00:01:00|0:0|node1|None|2026-12-03T07:01:20|2026-12-03T07:02:20
700|REQUEUED|00:00:30|0:0|node1|None|2026-12-03T07:02:30|2026-12-03T07:03:00
700|RUNNING|00:00:05|0:0|node4|None|2026-12-03T07:03:10|Unknown
"""


def _entry(job: str, purpose: str, when: str, note: str = "", **data: object) -> runs.HistoryEntry:
    local = time.strftime("%z", time.localtime(time.mktime(time.strptime(when, "%Y-%m-%dT%H:%M:%S"))))
    return runs.HistoryEntry(job, purpose, "slurm", when + local, note, dict(data))


def test_restarts_show_each_cause() -> None:
    attempts = slurm_output.parse_attempts(SACCT)
    assert [a.info.state for a in attempts["700"]] == ["REQUEUED", "PREEMPTED", "TIMEOUT", "REQUEUED", "RUNNING"]
    history = [_entry("700", "train", "2026-12-03T06:59:58"),
               _entry("700", "requeue", "2026-12-03T07:02:58", note="time limit warning: requeue 1 of 3")]
    events = [_entry("700", "start", "2026-12-03T07:00:01", restart_count=0, step=0),
              _entry("700", "start", "2026-12-03T07:00:52", restart_count=1, step=4),
              _entry("700", "start", "2026-12-03T07:03:11", restart_count=4, step=12)]
    rows = status.restarts(history, events, attempts)
    assert [(r.attempt, r.cause, r.resumed_step) for r in rows] == [
        (1, "requeue (scontrol requeue: SIGTERM, no save)", 4), (2, "preemption", None), (3, "time limit", None),
        (4, "time limit", 12)]
    assert rows[3].detail == "time limit warning: requeue 1 of 3"


def test_local_run_shows_real_elapsed_time(run: Path) -> None:
    folder = run / "submitit"
    folder.mkdir()
    # a local job's id is its PID: one above pid_max is never a live process (12345 once was, on a busy machine)
    pid = str(int(Path("/proc/sys/kernel/pid_max").read_text()) + 1)
    runs.append_history(run, pid, "train", "local")
    submitted = time.time()
    result = folder / f"{pid}_0_result.pkl"
    import pickle

    result.write_bytes(pickle.dumps(("success", 0)))
    os.utime(result, (submitted + 75, submitted + 75))
    st = status.run_status(run)
    (row,) = st.jobs
    assert row.state == "COMPLETED" and 74 <= row.elapsed_s <= 77 and st.time_used_s == row.elapsed_s


def test_events_are_not_jobs_and_failures_show(run: Path) -> None:
    runs.append_history(run, "999999", "train", "local")
    runs.append_history(run, "999999", "start", "local", note="starts from step 0", data={"step": 0})
    runs.append_history(run, "999999", "failed", "local", note="disk full: the disk ... hpc-grpo resume r")
    st = status.run_status(run)
    assert [j.job_id for j in st.jobs] == ["999999"] and st.failures == ["job 999999: disk full: the disk ... hpc-grpo resume r"]
    proc = cli("status", str(run))
    assert proc.returncode == 0 and "stopped:" in proc.stdout and "hpc-grpo resume r" in proc.stdout


def test_resume_at_max_steps_trains_nothing(tmp_path: Path) -> None:
    """transformers 5 checks max_steps only after a step, so a resume from the last checkpoint would train one
    step past it: the job must stop before calling train() (the guard runs before any heavy import)."""
    spec = resolve_spec("tiny-gsm8k", "local", overrides=[f"cluster.runs_root={tmp_path}", "train.total_training_steps=4",
                                                          "checkpoint.save_freq=2"], run_name="done")
    write_files(spec.path, render_all(spec))
    trees.trl_checkpoint(spec.path, 2)
    trees.trl_checkpoint(spec.path, 4)
    proc = subprocess.run([sys.executable, "-m", "hpc_grpo.job.trl_job", "--spec", str(spec.path / "spec.yaml")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "already trained: checkpoint-4 is step 4 of 4" in proc.stdout
    done = json.loads((spec.path / "train_done.json").read_text())
    assert done["final_step"] == 4 and done["last_checkpoint"].endswith("checkpoint-4")
    assert sorted(p.name for p in (spec.path / "checkpoints").iterdir()) == ["checkpoint-2", "checkpoint-4"]
    (start,) = [e for e in runs.read_history(spec.path) if e.purpose == "start"]
    assert start.data["step"] == 4
