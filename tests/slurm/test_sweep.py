"""`hpc-grpo sweep` on the real local Slurm cluster (tools/slurm-dev): no mocks.

A 2 x 2 grid of the tiny trl recipe (shrunk: 2 prompts x 4 completions, 8 new tokens, STEPS steps, a validation on
VAL_ROWS prompts after every step) goes out as one job array with 2 members in flight and successive halving at
step RUNG (eta 2, by the validation reward). Its axes make the halving's outcome known in advance, honestly: with
grpo.format_score=0 a random tiny model, which never answers a GSM8K question, earns reward 0 on every sample, so
those two members never move and validate at exactly 0, while format_score 0.1 pays any final number; and
grpo.kl_coef changes nothing before the rung, because the KL term and its gradient are zero while the policy still
equals its reference (the first step), so the two rewarded members validate alike at RUNG and neither stops the
other. The rewarded members are the first two array tasks; the other two can only start once a running task has
left (preempted, or ended), which the test makes happen after both rewarded members passed the rung, so each
unrewarded member meets the rung behind them and is stopped there.

While it runs, one rewarded member is preempted by a job in the `high` partition (it saves at the next step end
and is requeued), and the last member is cancelled while still pending; `hpc-grpo resume SWEEP` then queues only
that member, as a new array with its own index. The test asserts that at most 2 tasks of the array ever ran at
once (sacct's allocations), that the rewarded members trained to their last step and the others stopped at the
rung with the reason in their history and in `sweep status --json`, that the preempted member's restart is
recorded as a preemption, that a second `resume SWEEP` leaves the stopped members, and that `report SWEEP`
overlays the members' curves and marks the best.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from hpc_grpo.cluster import slurm
from hpc_grpo.runstate import runs
from tests.slurm.jobs import wait_final
from tests.slurm.test_signals import DEADLINE_S, Env, metric_rows, preempt
from tests.slurm.test_signals import env  # noqa: F401 - the module fixture: data, tiny model, environment

pytestmark = [pytest.mark.slurm, pytest.mark.usefixtures("slurm_cluster")]

STEPS, RUNG, VAL_ROWS = 8, 1, 8
SHRINK = [f"train.total_training_steps={STEPS}", "checkpoint.save_freq=4", "checkpoint.keep_last=2", "batch.train=2",
          "batch.mini=2", "batch.micro_per_gpu=4", "batch.log_prob_micro_per_gpu=4", "data.max_response_length=8"]
# a validation after every step; a patience no run of STEPS steps reaches: only the halving stops a member
VALIDATE = ["train.test_freq=1", "train.early_stop.metric=eval_reward", f"train.early_stop.patience={STEPS}",
            f"train.early_stop.val_rows={VAL_ROWS}"]
AXES = ["grpo.format_score=[0.1,0.0]", "grpo.kl_coef=[0.001,0.01]"]
HALVING = ["--rungs", str(RUNG), "--eta", "2", "--metric", "eval_reward"]
REWARDED, UNREWARDED = [0, 1], [2, 3]


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


def rung_value(run_dir: Path) -> float | None:
    """The member's validation reward at the rung, as its metrics.jsonl holds it."""
    return next((r["eval_reward"] for r in metric_rows(run_dir) if r["step"] == RUNG and "eval_reward" in r), None)


def train_steps(run_dir: Path) -> list[int]:
    return [r["step"] for r in metric_rows(run_dir) if "reward" in r]


def test_sweep_array_halving_two_in_flight_preempted_member_resumes(env: Env) -> None:  # noqa: F811
    name = env.name("sweep")
    t0 = time.monotonic()
    proc = cli(env, "sweep", "cluster=slurm-dev", f"cluster.runs_root={env.runs_root}", *env.tiny, *SHRINK,
               *VALIDATE, *AXES, "--parallel", "2", *HALVING, "--name", name)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    said = " ".join(proc.stdout.split())
    assert f"Successive halving at steps {RUNG}" in said, proc.stdout
    assert f"Cost: no GPU-hours (CPU jobs); successive halving at steps {RUNG} (eta 2): members training past each " \
           "rung: 4 -> 2" in said, proc.stdout
    folder = env.runs_root / name
    manifest = json.loads((folder / "sweep.json").read_text())
    assert [m["overrides"] for m in manifest["members"]] == [
        ["grpo.format_score=0.1", "grpo.kl_coef=0.001"], ["grpo.format_score=0.1", "grpo.kl_coef=0.01"],
        ["grpo.format_score=0.0", "grpo.kl_coef=0.001"], ["grpo.format_score=0.0", "grpo.kl_coef=0.01"]]
    assert (manifest["rungs"], manifest["eta"], manifest["metric"]) == ([RUNG], 2, "eval_reward")
    (array,) = [a["job_id"] for a in manifest["arrays"]]
    members = [folder / m["name"] for m in manifest["members"]]
    # every member is in the W&B group named by the sweep (logging.group; W&B is not a logger of these tiny runs)
    assert [yaml.safe_load((m / "spec.yaml").read_text())["recipe"]["logging"]["group"] for m in members] == [name] * 4
    tasks = [f"{array}_{i}" for i in range(4)]
    assert [runs.read_history(m)[0].job_id for m in members] == tasks
    assert "#SBATCH --array=0-3%2" in (folder / "scripts" / "sbatch.sh").read_text()
    last = tasks[3]
    try:
        # the last member is cancelled before it starts; `resume SWEEP` queues it again below
        assert slurm.job_states([last])[last].state == "PENDING"
        slurm.cancel(last)
        # both rewarded members pass the rung before any slot frees for the others: then one is preempted
        end = time.monotonic() + DEADLINE_S
        while any(rung_value(members[i]) is None for i in REWARDED):
            assert time.monotonic() < end, "the rewarded members did not validate at the rung in time"
            states = slurm.job_states(tasks[:3])
            assert states[tasks[2]].state == "PENDING", states  # %2: no third task while both run
            time.sleep(0.2)
        running = [i for i in REWARDED if len(train_steps(members[i])) < STEPS]
        assert running, "both rewarded members ended before one could be preempted"
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
    values = [rung_value(m) for m in members]
    print(f"\nsweep of 4 tiny members with halving: {took:.0f} s from `sweep` to the last member's end; at most "
          f"{at_once} tasks of array {array} at once; member {victim} preempted; member 3 resumed as "
          f"{resumed[0].job_id}; eval_reward at step {RUNG}: {values}")
    assert 1 <= at_once <= 2, intervals
    assert len([i for i in intervals if i[0] == tasks[victim]]) >= 2  # the preempted allocation and the requeued one
    requeue = [h for h in runs.read_history(members[victim]) if h.purpose == "requeue"]
    assert requeue and "preempt" in requeue[0].note.lower(), requeue

    # the premise: the rewarded members validate alike and above 0 at the rung, the unrewarded ones at exactly 0
    good = values[REWARDED[0]]
    assert good is not None and good > 0 and values[REWARDED[1]] == good, values
    assert [values[i] for i in UNREWARDED] == [0.0, 0.0], values
    for i in REWARDED:
        assert json.loads((members[i] / "train_done.json").read_text())["final_step"] == STEPS
        assert train_steps(members[i]) == list(range(1, STEPS + 1))
    for i in UNREWARDED:
        m = members[i]
        assert not (m / "train_done.json").exists() and train_steps(m) == [RUNG]  # stopped, not trained
        assert (m / "checkpoints" / f"checkpoint-{RUNG}").is_dir()  # saved where it stopped: --force resumes it
        (stopped,) = [h for h in runs.read_history(m) if h.purpose == "stopped"]
        assert stopped.data["halving"] and stopped.data["rung"] == RUNG and stopped.data["value"] == 0.0
        assert stopped.data["cutoff"] == good and good in stopped.data["others"], stopped.data

    proc = cli(env, "sweep", "status", name, "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = json.loads(proc.stdout)["members"]
    assert [r["state"] for r in rows] == ["COMPLETED"] * 4
    assert [r["step"] for r in rows] == [STEPS, STEPS, RUNG, RUNG]
    assert [r["job_id"] for r in rows] == [*tasks[:3], resumed[0].job_id]
    assert all(rows[i]["stopped"].startswith("trained") for i in REWARDED), rows
    for i in UNREWARDED:
        assert rows[i]["stopped"].startswith("stopped by the sweep's successive halving: eval_reward 0 at rung step "
                                             f"{RUNG}, cutoff {good:.4g} (top 1/2, max"), rows[i]
        assert rows[i]["best"] == 0.0 and rows[i]["best_step"] == RUNG
    # the stopped members stay stopped: `resume SWEEP` leaves them (and the trained ones)
    proc = cli(env, "resume", name)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "no member to resume" in proc.stdout and proc.stdout.count("successive halving") == 2, proc.stdout
    # the report overlays the members' curves and marks the best by the sweep's metric (the validation reward)
    proc = cli(env, "report", name, "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(proc.stdout)
    assert [m["name"] for m in report["members"]] == [m.name for m in members]
    assert [len(m["reward"]) for m in report["members"]] == [STEPS, STEPS, RUNG, RUNG]
    assert [len(m["eval_reward"]) for m in report["members"]] == [STEPS, STEPS, RUNG, RUNG]
    best = max(rows, key=lambda r: (r["best"], r["name"]))["name"]
    assert report["best"] == best and best in [members[i].name for i in REWARDED]
    assert (folder / "report.png").stat().st_size > 0
    # an ordinary run: `status` of one member shows its restart as a preemption
    proc = cli(env, "status", str(members[victim]), "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    restarts = json.loads(proc.stdout)["restarts"]
    assert restarts and restarts[0]["job_id"] == tasks[victim] and restarts[0]["cause"] == "preemption", restarts
