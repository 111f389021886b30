"""Resume for real: `scontrol requeue` of a running tiny trl job on the local Slurm cluster, `hpc-grpo resume`
refused while that job is alive, and a disk that fills up during a save (a small tmpfs as the runs root,
cluster=local: the same job code, without waiting for a busy cluster's free node), grown, then resumed.

Nothing is stood in: real Slurm, real submitit, real trl training on CPU, real checkpoints, a real tmpfs.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from hpc_grpo.runstate import checkpoints as ck
from hpc_grpo.runstate import runs
from hpc_grpo.cluster import slurm
from hpc_grpo.runstate import layout
from tests.slurm.jobs import wait_final
from tests.slurm.test_submit import GSM8K, TRAIN_DEADLINE_S, Env, make_env

pytestmark = [pytest.mark.slurm, pytest.mark.usefixtures("slurm_cluster")]

STEPS, SAVE = 6, 2


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Env:
    if not GSM8K.is_dir():
        pytest.fail(f"{GSM8K} is missing: the GSM8K files live in ../shared beside the checkout", pytrace=False)
    from hpc_grpo.data.gsm8k import prepare_gsm8k
    from hpc_grpo.data.tiny_model import ensure_tiny_model

    e = make_env(tmp_path_factory.mktemp("resume"))
    data = prepare_gsm8k(GSM8K, e.root / "data")
    model = ensure_tiny_model(e.root / "models" / "tiny-qwen2")  # once: the jobs below must not race to build it
    e.tiny = ["recipe=tiny-gsm8k", f"data.train_files={data.trl_train}", f"data.val_files={data.trl_test}",
              f"model.path={model}", f"train.total_training_steps={STEPS}", f"checkpoint.save_freq={SAVE}",
              "checkpoint.keep_last=10", "eval.enabled=false"]  # about resume; the chained eval is test_eval_chain.py's
    return e


def train_job(run_dir: Path) -> str:
    return next(e.job_id for e in runs.read_history(run_dir) if e.purpose in ("train", "resume"))


def metric_steps(run_dir: Path) -> list[int]:
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line)["step"])
        except (ValueError, KeyError):
            pass
    return out


def adapter(run_dir: Path, step: int) -> dict:
    from safetensors.torch import load_file

    return load_file(run_dir / "checkpoints" / f"checkpoint-{step}" / "adapter_model.safetensors")


def assert_same_adapter(a: Path, b: Path, step: int) -> None:
    import torch

    ta, tb = adapter(a, step), adapter(b, step)
    assert sorted(ta) == sorted(tb)
    for name in ta:
        assert torch.equal(ta[name], tb[name]), f"{name} differs from the uninterrupted run"


def wait_for(what: str, cond, deadline_s: float, job_id: str | None = None):
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        value = cond()
        if value:
            return value
        time.sleep(0.2)
    if job_id:
        slurm.cancel(job_id)
    pytest.fail(f"timed out after {deadline_s:.0f}s waiting for {what}")


# ------------------------------------------------------------------------------------------ scontrol requeue
def test_scontrol_requeue_resumes_from_newest_checkpoint(env: Env) -> None:
    ref_name, rq_name = env.name("ref"), env.name("requeue")
    for name in (ref_name, rq_name):
        proc = env.submit(*env.tiny, "--name", name)
        assert proc.returncode == 0, proc.stdout + proc.stderr
    ref, rq = env.runs_root / ref_name, env.runs_root / rq_name
    ref_job, job = train_job(ref), train_job(rq)
    try:
        # a live job: resume refuses, names it, and queues nothing
        proc = env.cli("resume", str(rq))
        assert proc.returncode == 2 and "already has a live job" in proc.stderr and job in proc.stderr, proc.stderr
        assert [e.purpose for e in runs.read_history(rq) if e.purpose not in runs.EVENTS] == ["train"]

        first = wait_for(f"checkpoint-{SAVE} of job {job}",
                         lambda: ck.newest_complete(ck.list_checkpoints(rq, "trl")), TRAIN_DEADLINE_S, job)
        assert first.step < STEPS, "the job finished before it could be requeued"
        slurm.requeue(job)  # SIGTERM: no save, the job is queued again under its id
        time.sleep(1.0)
        reached = max(metric_steps(rq))
        t_requeue = time.monotonic()

        ref_info = wait_final(ref_job, TRAIN_DEADLINE_S)
        info = wait_final(job, TRAIN_DEADLINE_S)
    finally:
        for j in (ref_job, job):
            if slurm.job_states([j]).get(j, None) and slurm.job_states([j])[j].live:
                slurm.cancel(j)
    assert ref_info.state == "COMPLETED" and info.state == "COMPLETED", (ref_info, info)

    starts = [e for e in runs.read_history(rq) if e.purpose == "start"]
    assert [e.data["restart_count"] for e in starts] == [0, 1], starts
    resumed = starts[1].data["step"]
    lost = reached - resumed
    print(f"\nscontrol requeue at step {reached} (newest checkpoint {first.step} when polled): resumed from step "
          f"{resumed}, {lost} step(s) lost; requeue to completion {time.monotonic() - t_requeue:.1f} s")
    assert resumed >= first.step and resumed % SAVE == 0 and 0 <= lost <= SAVE
    assert metric_steps(rq) == list(range(1, STEPS + 1))  # transformers did not run past max_steps either
    assert json.loads((rq / "train_done.json").read_text())["final_step"] == STEPS
    assert_same_adapter(ref, rq, STEPS)

    st = env.status(rq)
    (restart,) = st["restarts"]
    assert restart["job_id"] == job and restart["cause"].startswith("requeue (scontrol requeue")
    assert restart["resumed_step"] == resumed


# ------------------------------------------------------------------------------------------ disk full
@pytest.fixture()
def small_tmpfs(env: Env):
    mnt = env.root / "tmpfs"
    mnt.mkdir(exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={TMPFS_KIB}k", "tmpfs", str(mnt)], check=True)
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


# The tiny run's files take about 110 KiB (64 KiB of it the disk-full reserve) and each checkpoint about 310 KiB
# (measured): 960 KiB holds two checkpoints, and the third save runs out of space (trl rotates after a save).
TMPFS_KIB = 960
DISK_STEPS = 4


def test_disk_full_during_a_save_then_resume(env: Env, small_tmpfs: Path) -> None:
    name = env.name("diskfull")
    # keep=2 (the recipe's): plan's disk check passes (it estimates 3 x 0.2 MB for the tiny model's LoRA), the
    # real checkpoints (adapter, Adam state, tokenizer files) are larger: the disk fills during a save anyway.
    tiny = [o for o in env.tiny if not o.startswith(("checkpoint.", "train.total_training_steps"))]
    tiny += ["checkpoint.save_freq=1", "checkpoint.keep_last=2", f"train.total_training_steps={DISK_STEPS}"]
    proc = env.cli("submit", "cluster=local", f"cluster.runs_root={small_tmpfs}", *tiny, "--name", name, "--wait",
                   timeout=TRAIN_DEADLINE_S)
    run = small_tmpfs / name
    log = "".join(p.read_text(errors="replace") for p in (run / "submitit").glob("*_log.*"))
    assert proc.returncode != 0, proc.stdout[-3000:]
    assert "the disk of the run directory is full" in log, proc.stdout[-3000:] + proc.stderr[-3000:] + log[-4000:]
    assert f"{small_tmpfs} (tmpfs)" in log and f"hpc-grpo resume {name}" in log
    (failed,) = [e for e in runs.read_history(run) if e.purpose == "failed"]
    assert failed.note.startswith("disk full:")
    ckpts = ck.list_checkpoints(run, "trl")
    good = ck.newest_complete(ckpts)
    assert good is not None and good.step < DISK_STEPS
    torn = [c for c in ckpts if not c.complete and c.step > good.step]
    status = env.status(run)
    assert any("disk full" in f for f in status["failures"])

    subprocess.run(["mount", "-o", "remount,size=64m", str(small_tmpfs)], check=True)
    proc = env.cli("resume", str(run), "--wait", timeout=TRAIN_DEADLINE_S)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert f"It resumes from {good.path} (step {good.step})." in proc.stdout
    start = [e for e in runs.read_history(run) if e.purpose == "start"][-1]
    assert start.data["step"] == good.step
    assert [Path(q["from"]).name for q in start.data["quarantined"]] == [c.path.name for c in torn]
    for q in start.data["quarantined"]:
        assert Path(q["to"]).parent == run / layout.QUARANTINE_DIR and Path(q["to"]).is_dir()  # kept, not deleted
    assert json.loads((run / "train_done.json").read_text())["final_step"] == DISK_STEPS
    assert metric_steps(run) == list(range(1, DISK_STEPS + 1))
    print(f"\ndisk full at the save after step {good.step} ({[c.path.name for c in torn]} torn); resumed from step "
          f"{good.step} after the tmpfs grew, finished step {DISK_STEPS}")
    resume_line = [e for e in runs.read_history(run) if e.purpose == "resume"][-1]
    assert resume_line.data["resume_step"] == good.step
