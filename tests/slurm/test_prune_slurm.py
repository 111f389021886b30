"""Retention across restarts on the real local Slurm cluster: a tiny trl run with keep_last 2 and keep_every 4,
requeued twice with `scontrol requeue`, ends with exactly the 2 newest complete checkpoints plus the milestones,
those saved before each restart included (verl's own limit forgets them: verl #7395)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from hpc_grpo.runstate import checkpoints as ck
from hpc_grpo.runstate import runs
from hpc_grpo.cluster import slurm
from tests.slurm.test_submit import Env, make_env

pytestmark = [pytest.mark.slurm, pytest.mark.usefixtures("slurm_cluster")]

REPO = Path(__file__).resolve().parents[2]
GSM8K = Path(os.environ.get("HPC_GRPO_GSM8K_DIR", REPO.parent / "shared" / "data" / "gsm8k"))
STEPS, KEEP_LAST, KEEP_EVERY = 10, 2, 4
DEADLINE_S = 900.0  # ~2 min on a quiet machine (three starts of a 10-step CPU run); a busy shared cluster needs more


def newest_step(run_dir: Path) -> int:
    c = ck.newest_complete(ck.list_checkpoints(run_dir, "trl"))
    return c.step if c else 0


def restarts(job_id: str) -> int:
    out = slurm._run(["scontrol", "show", "job", job_id])
    for word in out.split():
        if word.startswith("Restarts="):
            return int(word.split("=", 1)[1])
    return 0


def wait_until(what: str, cond, job_id: str, end: float) -> None:
    while not cond():
        if time.monotonic() > end:
            slurm.cancel(job_id)
            pytest.fail(f"timed out waiting for {what} (job {job_id}: {slurm.job_states([job_id]).get(job_id)})")
        time.sleep(0.5)


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Env:
    if not GSM8K.is_dir():
        pytest.fail(f"{GSM8K} is missing: the GSM8K files live in ../shared beside the checkout", pytrace=False)
    from hpc_grpo.data.gsm8k import prepare_gsm8k

    e = make_env(tmp_path_factory.mktemp("prune"))
    data = prepare_gsm8k(GSM8K, e.root / "data")
    e.tiny = ["recipe=tiny-gsm8k", "eval.enabled=false", f"data.train_files={data.trl_train}", f"data.val_files={data.trl_test}",
              f"model.path={e.root / 'models' / 'tiny-qwen2'}"]
    return e


def test_keep_last_holds_across_two_requeues(env: Env) -> None:
    name = env.name("prune-requeue")
    proc = env.submit(*env.tiny, f"train.total_training_steps={STEPS}", "checkpoint.save_freq=1",
                      f"checkpoint.keep_last={KEEP_LAST}", f"checkpoint.keep_every={KEEP_EVERY}",
                      "checkpoint.grace_s=0", "--name", name)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    run_dir = env.runs_root / name
    job_id = runs.last_job_id(run_dir)
    end = time.monotonic() + DEADLINE_S
    t0 = time.monotonic()
    try:
        for n, at_step in enumerate((3, 6), start=1):
            wait_until(f"checkpoint {at_step} before requeue {n}", lambda s=at_step: newest_step(run_dir) >= s,
                       job_id, end)
            slurm.requeue(job_id)
            wait_until(f"restart {n} recorded", lambda n=n: restarts(job_id) >= n, job_id, end)
        wait_until("the job to end", lambda: not slurm.job_states([job_id])[job_id].live, job_id, end)
    finally:
        info = slurm.job_states([job_id]).get(job_id)
        if info is not None and info.live:
            slurm.cancel(job_id)
    log = (run_dir / "submitit" / f"{job_id}_0_log.out")
    text = log.read_text() if log.exists() else ""
    info = slurm.job_states([job_id])[job_id]
    print(f"\nprune across requeues: job {job_id} {info.state} after {time.monotonic() - t0:.0f}s, "
          f"{restarts(job_id)} restarts")
    print("\n".join(line for line in text.splitlines() if "prune" in line or "resuming" in line))
    assert info.state == "COMPLETED", text[-4000:]
    assert restarts(job_id) == 2
    # The job started three times and pruned at every start, after resume preparation.
    assert text.count("[job start]") == 3, text[-4000:]
    left = ck.list_checkpoints(run_dir, "trl")
    milestones = [s for s in range(1, STEPS + 1) if s % KEEP_EVERY == 0]
    assert [c.step for c in left] == sorted({*milestones, *range(STEPS - KEEP_LAST + 1, STEPS + 1)}), left
    assert all(c.complete for c in left)
    # Checkpoints saved before a restart went too: step 1..2 were removed by the first attempt, 3 by a later one.
    assert not (run_dir / "checkpoints" / "checkpoint-3").exists()
