"""`hpc-grpo sweep` on the real local Slurm cluster (tools/slurm-dev): no mocks.

A 2 x 2 grid of the tiny trl recipe (shrunk: 2 prompts x n completions, 8 new tokens, STEPS steps) goes out as one
job array with 2 members in flight. While it runs, one running member is preempted by a job in the `high`
partition (it saves at the next step end and is requeued), and the last member is cancelled while still pending;
`hpc-grpo resume SWEEP` then queues only that member, as a new array with its own index. The test asserts that
at most 2 tasks of the array ever ran at once (sacct's allocations), that every member trained to its last step
in its own run directory, that the preempted member's restart is recorded as a preemption, and what
`sweep status --json` says of each member, and that `report SWEEP` overlays the members and names the best.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import pytest

from hpc_grpo.cluster import slurm
from hpc_grpo.runstate import runs
from tests.slurm.jobs import wait_final
from tests.slurm.test_signals import DEADLINE_S, Env, metric_rows, preempt
from tests.slurm.test_signals import env  # noqa: F401 - the module fixture: data, tiny model, environment

pytestmark = [pytest.mark.slurm, pytest.mark.usefixtures("slurm_cluster")]

STEPS = 5
SHRINK = [f"train.total_training_steps={STEPS}", "checkpoint.save_freq=4", "checkpoint.keep_last=2", "batch.train=2",
          "batch.mini=2", "batch.micro_per_gpu=4", "batch.log_prob_micro_per_gpu=4", "data.max_response_length=8"]
AXES = ["grpo.lr=[1e-2,2e-2]", "grpo.n=[2,4]"]


def cli(e: Env, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "hpc_grpo.cli.app", *args], capture_output=True, text=True,
                          env=e.env, cwd=e.root, timeout=180, stdin=subprocess.DEVNULL, check=False)


def sacct_intervals(array_id: str) -> list[tuple[str, float, float]]:
    """(task, start, end) of every allocation of the array's tasks (-D: requeued ones too), epoch seconds."""
    out = subprocess.run(["sacct", "-X", "-D", "-j", array_id, "--parsable2", "--noheader", "-o", "JobID,Start,End"],
                         capture_output=True, text=True, timeout=30, check=True).stdout
    found = []
    for line in out.splitlines():
        jid, start, end = line.split("|")
        if "[" in jid or start in ("Unknown", "None", ""):
            continue
        t0 = time.mktime(time.strptime(start, "%Y-%m-%dT%H:%M:%S"))
        t1 = time.time() if end in ("Unknown", "None", "") else time.mktime(time.strptime(end, "%Y-%m-%dT%H:%M:%S"))
        found.append((jid, t0, t1))
    return found


def most_at_once(intervals: list[tuple[str, float, float]]) -> int:
    """The largest number of allocations that overlapped (an end and a start in the same second do not)."""
    points = sorted([(t0, 1) for _, t0, _ in intervals] + [(t1, -1) for _, _, t1 in intervals],
                    key=lambda p: (p[0], p[1]))
    now = top = 0
    for _, delta in points:
        now += delta
        top = max(top, now)
    return top


def test_sweep_array_two_in_flight_preempted_member_resumes(env: Env) -> None:  # noqa: F811
    name = env.name("sweep")
    t0 = time.monotonic()
    proc = cli(env, "sweep", "cluster=slurm-dev", f"cluster.runs_root={env.runs_root}", *env.tiny, *SHRINK, *AXES,
               "--parallel", "2", "--name", name)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    folder = env.runs_root / name
    manifest = json.loads((folder / "sweep.json").read_text())
    assert [m["overrides"] for m in manifest["members"]] == [
        ["grpo.lr=1e-2", "grpo.n=2"], ["grpo.lr=1e-2", "grpo.n=4"], ["grpo.lr=2e-2", "grpo.n=2"],
        ["grpo.lr=2e-2", "grpo.n=4"]]
    (array,) = [a["job_id"] for a in manifest["arrays"]]
    members = [folder / m["name"] for m in manifest["members"]]
    tasks = [f"{array}_{i}" for i in range(4)]
    assert [runs.read_history(m)[0].job_id for m in members] == tasks
    assert "#SBATCH --array=0-3%2" in (folder / "scripts" / "sbatch.sh").read_text()
    last = tasks[3]
    try:
        # the last member is cancelled before it starts; `resume SWEEP` queues it again below
        assert slurm.job_states([last])[last].state == "PENDING"
        slurm.cancel(last)
        # a running member is preempted once it has logged a step
        end = time.monotonic() + DEADLINE_S
        while not (running := [i for i, m in enumerate(members[:3]) if metric_rows(m)]):
            assert time.monotonic() < end, "no member logged a step in time"
            time.sleep(0.2)
        victim = running[0]
        cleanup = preempt(env, tasks[victim])
        try:
            end = time.monotonic() + DEADLINE_S  # the save before the requeue waits for a step end: slow beside verl
            while not any(h.purpose == "requeue" for h in runs.read_history(members[victim])):
                assert time.monotonic() < end, f"member {victim} was not requeued"
                time.sleep(0.2)
        finally:
            cleanup()
        # a pending array task that is cancelled leaves no record of its own: squeue and sacct forget it
        gone = slurm.job_states([last]).get(last)
        assert gone is None or gone.state == "CANCELLED", gone
        proc = cli(env, "resume", name)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        resumed = [h for h in runs.read_history(members[3]) if h.purpose == "resume"]
        assert len(resumed) == 1 and resumed[0].job_id.endswith("_3") and not resumed[0].job_id.startswith(array)
        infos = {t: wait_final(t, DEADLINE_S) for t in [*tasks[:3], resumed[0].job_id]}
    finally:
        for t in tasks:
            info = slurm.job_states([t]).get(t)
            if info is not None and info.live:
                slurm.cancel(t)
    took = time.monotonic() - t0
    assert all(i.state == "COMPLETED" for i in infos.values()), infos

    intervals = sacct_intervals(array)
    at_once = most_at_once(intervals)
    print(f"\nsweep of 4 tiny members: {took:.0f} s from `sweep` to the last member's end; at most {at_once} tasks of "
          f"array {array} at once; member {victim} preempted; member 3 resumed as {resumed[0].job_id}")
    assert 1 <= at_once <= 2, intervals
    assert len([i for i in intervals if i[0] == tasks[victim]]) >= 2  # the preempted allocation and the requeued one

    for m in members:
        assert json.loads((m / "train_done.json").read_text())["final_step"] == STEPS
        assert [r["step"] for r in metric_rows(m)] == list(range(1, STEPS + 1))
    requeue = [h for h in runs.read_history(members[victim]) if h.purpose == "requeue"]
    assert requeue and "preempt" in requeue[0].note.lower(), requeue

    proc = cli(env, "sweep", "status", name, "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    status = json.loads(proc.stdout)
    rows = status["members"]
    assert [r["state"] for r in rows] == ["COMPLETED"] * 4
    assert [r["step"] for r in rows] == [STEPS] * 4
    assert [r["job_id"] for r in rows] == [*tasks[:3], resumed[0].job_id]
    assert all(r["stopped"].startswith("trained") and r["best"] is not None for r in rows), rows
    # the report overlays the members' curves and names the best by the sweep's metric (reward)
    proc = cli(env, "report", name, "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(proc.stdout)
    assert [m["name"] for m in report["members"]] == [m.name for m in members]
    assert all(len(m["reward"]) == STEPS for m in report["members"])
    best = max(rows, key=lambda r: (r["best"], r["name"]))["name"]
    assert report["best"] == best and (folder / "report.png").stat().st_size > 0
    # an ordinary run: `status` of one member shows its restart as a preemption
    proc = cli(env, "status", str(members[victim]), "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    restarts = json.loads(proc.stdout)["restarts"]
    assert restarts and restarts[0]["job_id"] == tasks[victim] and restarts[0]["cause"] == "preemption", restarts
