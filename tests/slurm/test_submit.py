"""`hpc-grpo submit` against the real local Slurm cluster (tools/slurm-dev) and the local executor: no mocks.

Every command runs as a user would run it (`python -m hpc_grpo.cli.app ...` in a subprocess, `--no-wait` on Slurm), with
HOME, the working directory and the runs root inside the test's temp dir, W&B offline and the Hub off. The tiny-gsm8k
job (trl on CPU) builds its tiny model on first use into the temp dir and trains 4 steps, checkpointing every 2.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from hpc_grpo.launch import render
from hpc_grpo.runstate import runs
from hpc_grpo.cluster import slurm
from tests.conftest import ONE_THREAD
from tests.slurm.jobs import wait_final
from hpc_grpo.job.ray_probe import leftover_pids
from hpc_grpo.config.resolve import load_frozen
from hpc_grpo.runstate import layout

pytestmark = [pytest.mark.slurm, pytest.mark.usefixtures("slurm_cluster")]

REPO = Path(__file__).resolve().parents[2]
GSM8K = REPO.parent / "shared" / "data" / "gsm8k"
TRAIN_DEADLINE_S = 420.0  # the tiny job takes about 25 s on 2 cores; room for a loaded machine and a queue
# eval.enabled=false: these tests are about training; the chained evaluation has its own file (test_eval_chain.py).
TINY = ["train.total_training_steps=4", "checkpoint.save_freq=2", "eval.enabled=false"]


@dataclass
class Env:
    root: Path  # the temp dir: cwd of every command
    runs_root: Path
    env: dict[str, str]
    tiny: list[str]  # recipe=tiny-gsm8k overrides: data and model inside the temp dir
    tag: str = ""  # makes run (= Slurm job) names unique across sessions: squeue remembers old jobs for minutes

    def name(self, base: str) -> str:
        return f"{base}-{self.tag}"

    def cli(self, *args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "hpc_grpo.cli.app", *args], capture_output=True, text=True,
                              env=self.env, cwd=self.root, timeout=timeout, stdin=subprocess.DEVNULL, check=False)

    def submit(self, *args: str, cluster: str = "slurm-dev", wait: bool = False,
               timeout: float = 180) -> subprocess.CompletedProcess[str]:
        return self.cli("submit", f"cluster={cluster}", f"cluster.runs_root={self.runs_root}", *args,
                        "--wait" if wait else "--no-wait", timeout=timeout)

    def status(self, run_dir: Path) -> dict:
        proc = self.cli("status", str(run_dir), "--json")
        assert proc.returncode == 0, proc.stdout + proc.stderr
        return json.loads(proc.stdout)


def make_env(root: Path) -> Env:
    home = root / "home"
    home.mkdir(parents=True, exist_ok=True)
    drop = {"WANDB_API_KEY", "HF_TOKEN", "HPC_GRPO_PATH", "RAY_ADDRESS"}
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env.update(HOME=str(home), USER=env.get("USER", "user"), WANDB_MODE="offline", HF_HUB_OFFLINE="1", **ONE_THREAD,
               PATH=str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", ""))
    return Env(root, root / "runs", env, [], tag=f"{os.getpid():x}{int(time.time()) % 100000:x}")


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Env:
    if not GSM8K.is_dir():
        pytest.fail(f"{GSM8K} is missing: the GSM8K files live in ../shared beside the checkout", pytrace=False)
    from hpc_grpo.data.gsm8k import prepare_gsm8k

    e = make_env(tmp_path_factory.mktemp("submit"))
    data = prepare_gsm8k(GSM8K, e.root / "data")
    e.tiny = ["recipe=tiny-gsm8k", f"data.train_files={data.trl_train}", f"data.val_files={data.trl_test}",
              f"model.path={e.root / 'models' / 'tiny-qwen2'}", *TINY]
    return e


def submissions(run_dir: Path) -> list[runs.HistoryEntry]:
    """History lines that are submissions (a job's own "start"/"failed" events are not)."""
    return [e for e in runs.read_history(run_dir) if e.purpose not in runs.EVENTS]


def last_job(run_dir: Path) -> str:
    """The newest training job (an evaluation job queued afterok is recorded after it)."""
    return [e for e in submissions(run_dir) if e.purpose != "eval"][-1].job_id


def jobs_named(name: str) -> list[str]:
    """Every job slurmctld remembers under this job name (run names are unique per test)."""
    proc = subprocess.run(["squeue", "--noheader", "--states=all", "-n", name, "-o", "%i"], capture_output=True,
                          text=True, timeout=20, check=True)
    return proc.stdout.split()


# ------------------------------------------------------------------------------------------ tiny job on Slurm
@pytest.fixture(scope="module")
def tiny_slurm(env: Env) -> tuple[Path, str, str]:
    """Submit tiny-gsm8k once; keep the batch script slurmctld holds, read while the job is fresh."""
    proc = env.submit(*env.tiny, "--name", env.name("tiny-slurm"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    run_dir = env.runs_root / env.name("tiny-slurm")
    job_id = last_job(run_dir)
    assert f"Job: {job_id} (slurm)" in proc.stdout
    return run_dir, job_id, slurm.batch_script(job_id)


def test_tiny_job_completes_on_slurm(env: Env, tiny_slurm: tuple[Path, str, str]) -> None:
    run_dir, job_id, _ = tiny_slurm
    assert (run_dir / "spec.yaml").is_file() and (run_dir / "scripts" / "launch.sh").is_file()
    t0 = time.monotonic()
    info = wait_final(job_id, TRAIN_DEADLINE_S)
    log = run_dir / "submitit" / f"{job_id}_0_log.out"
    print(f"tiny-gsm8k on slurm-dev: job {job_id} {info.state} after {time.monotonic() - t0:.1f}s "
          f"(elapsed {info.elapsed})")
    assert info.state == "COMPLETED", (info, log.read_text()[-3000:] if log.exists() else "no log")
    history = submissions(run_dir)
    assert [(h.job_id, h.purpose, h.executor) for h in history] == [(job_id, "train", "slurm")]
    status = env.status(run_dir)
    assert status["jobs"][-1]["job_id"] == job_id
    assert status["jobs"][-1]["state"] == "COMPLETED"
    assert status["last_step"] == 4
    assert status["newest_checkpoint"] and Path(status["newest_checkpoint"]).name == "checkpoint-4"
    assert status["complete_checkpoints"] >= 1


def test_slurm_ran_the_rendered_script(tiny_slurm: tuple[Path, str, str]) -> None:
    run_dir, job_id, held = tiny_slurm
    saved = (run_dir / "scripts" / "sbatch.sh").read_text()
    rendered = render.render_sbatch(load_frozen(run_dir / "spec.yaml"))
    assert held == saved
    assert held == rendered


# ------------------------------------------------------------------------------------------ refused requests
def _assert_nothing_submitted(env: Env, name: str) -> None:
    assert jobs_named(name) == []
    assert not (env.runs_root / name / layout.HISTORY_FILE).exists()


@pytest.mark.parametrize("overrides,limit", [
    # the cluster profile claims more than the real partition has: only Slurm's answer (preflight) refuses
    (["resources.nodes=5", "cluster.nodes_max=8"], "5 nodes asked; partition low has 4"),
    (["resources.gpus_per_node=5", "cluster.gpus_per_node=8"], "5 GPUs per node asked; partition low nodes have 4"),
], ids=["nodes-partition", "gpus-partition"])
def test_request_beyond_the_partition_is_refused(env: Env, overrides: list[str], limit: str) -> None:
    name = env.name(f"refuse-{overrides[0].split('.')[1].split('=')[0]}")
    proc = env.submit("recipe=ray-probe", *overrides, "--name", name)
    assert proc.returncode == 1, proc.stdout + proc.stderr  # an error finding, as every preflight error
    assert all(word in " ".join(proc.stderr.split()) for word in limit.split()), proc.stderr
    _assert_nothing_submitted(env, name)


@pytest.mark.parametrize("override,limit", [
    ("resources.nodes=5", "5 nodes asked, cluster 'slurm-dev' has 4"),
    ("resources.gpus_per_node=5", "5 GPUs per node asked, 'slurm-dev' nodes have 4"),
], ids=["nodes-profile", "gpus-profile"])
def test_request_beyond_the_profile_is_refused_by_the_plan(env: Env, override: str, limit: str) -> None:
    """The cluster profile already knows the partition's size: plan refuses (an error finding: exit 1)."""
    name = env.name(f"refuse-plan-{override.split('.')[1].split('=')[0]}")
    proc = env.submit("recipe=ray-probe", override, "--name", name)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    text = " ".join((proc.stdout + proc.stderr).split())  # rich wraps table cells
    assert "Nothing submitted" in text
    assert all(word in text for word in limit.split()), text
    _assert_nothing_submitted(env, name)


# ------------------------------------------------------------------------------------------ live-job lock
def test_second_submit_into_a_live_run_is_refused(env: Env) -> None:
    name = env.name("busy-run")
    sleeper = ["recipe=ray-probe", "resources.nodes=1", "launch.driver=[python3,-m,hpc_grpo.job.ray_probe,--sleep=30]",
               "--name", name]
    first = env.submit(*sleeper)
    assert first.returncode == 0, first.stdout + first.stderr
    run_dir = env.runs_root / name
    first_id = last_job(run_dir)
    try:
        second = env.submit(*sleeper)
        assert second.returncode == 2, second.stdout + second.stderr
        assert "already has a live job" in second.stderr and first_id in second.stderr
        assert [h.job_id for h in submissions(run_dir)] == [first_id]
        assert jobs_named(name) == [first_id]
    finally:
        slurm.cancel(first_id)
    assert wait_final(first_id, 60).state == "CANCELLED"
    end = time.monotonic() + 15  # a cancelled job's Ray goes too (its processes only: the run dir is shared)
    while (left := leftover_pids(first_id)) and time.monotonic() < end:
        time.sleep(0.5)
    assert not left, left
    third = env.submit(*sleeper)
    assert third.returncode == 0, third.stdout + third.stderr
    third_id = last_job(run_dir)
    try:
        assert third_id != first_id
        history = submissions(run_dir)
        assert [(h.job_id, h.purpose) for h in history] == [(first_id, "train"), (third_id, "train")]
    finally:
        slurm.cancel(third_id)
        wait_final(third_id, 60)


# ------------------------------------------------------------------------------------------ no Slurm
def test_local_cluster_runs_the_tiny_job(env: Env) -> None:
    t0 = time.monotonic()
    name = env.name("tiny-local")
    proc = env.submit(*env.tiny, "--name", name, cluster="local", wait=True, timeout=TRAIN_DEADLINE_S)
    print(f"tiny-gsm8k on cluster=local: exit {proc.returncode} after {time.monotonic() - t0:.1f}s")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    run_dir = env.runs_root / name
    history = submissions(run_dir)
    assert [(h.purpose, h.executor) for h in history] == [("train", "local")]
    status = env.status(run_dir)
    assert status["jobs"][-1]["state"] == "COMPLETED"
    assert status["last_step"] == 4
    assert status["newest_checkpoint"] and Path(status["newest_checkpoint"]).name == "checkpoint-4"
    assert jobs_named(name) == []  # nothing went to Slurm
