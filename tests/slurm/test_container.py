"""A container profile on the real local Slurm cluster (tools/slurm-dev), with a stand-in for pyxis.

slurm-dev has no pyxis or enroot (Debian ships neither), so the profile's `setup.container_launcher` is
tests/slurm/container_standin.sh: a TEST DOUBLE FOR PYXIS ONLY. It takes pyxis's options exactly as the rendered
srun line gives them and runs the task in a fresh mount namespace where, of the host, only the system folders (the
stand-in's "image") and the listed mounts are visible (/tmp, /work, /root, /home are empty), and where Slurm's
client commands fail with "command not found", as in an image without them. Everything else is real: Slurm,
submitit, the batch script, the trl job on the tiny model.

The tests show that a job whose profile mounts its model, data and interpreter finishes; that plan refuses a profile
missing the data mount, and that without plan the job dies in the stand-in for want of the data; and that a USR2
(what the time-limit warning sends) saves, requeues through the batch script (outside the "container") and resumes.
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

from hpc_grpo.cluster import slurm
from hpc_grpo.planning.container import venv_base
from hpc_grpo.runstate import layout, runs
from tests.conftest import ONE_THREAD, require_gsm8k
from tests.slurm.jobs import wait_final

pytestmark = [pytest.mark.slurm, pytest.mark.usefixtures("slurm_cluster")]

REPO = Path(__file__).resolve().parents[2]
STANDIN = Path(__file__).with_name("container_standin.sh")
DEADLINE_S = 420.0
TINY = ["train.total_training_steps=4", "checkpoint.save_freq=2", "eval.enabled=false"]


@dataclass
class Env:
    root: Path
    env: dict[str, str]
    data: Path  # folder of the prepared data files
    tiny: list[str]  # recipe, data, model and the stand-in container, without its mounts
    mounts: dict[str, str]  # what the job reads -> its mount entry
    tag: str

    def name(self, base: str) -> str:
        return f"{base}-{self.tag}"

    def mount_override(self, leave_out: str = "") -> str:
        return "cluster.setup.mounts=[" + ",".join(m for k, m in self.mounts.items() if k != leave_out) + "]"

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "hpc_grpo.cli.app", *args], capture_output=True, text=True,
                              env=self.env, cwd=self.root, timeout=300, stdin=subprocess.DEVNULL, check=False)

    def runs_root(self) -> Path:
        return self.root / "runs"


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Env:
    from hpc_grpo.data.gsm8k import prepare_gsm8k
    from hpc_grpo.data.tiny_model import ensure_tiny_model

    gsm8k = require_gsm8k()
    root = tmp_path_factory.mktemp("container")
    (root / "home").mkdir()
    data = prepare_gsm8k(gsm8k, root / "data")
    model = ensure_tiny_model(root / "models" / "tiny-qwen2")
    drop = {"WANDB_API_KEY", "HF_TOKEN", "HPC_GRPO_PATH", "RAY_ADDRESS"}
    e = {k: v for k, v in os.environ.items() if k not in drop}
    e.update(HOME=str(root / "home"), WANDB_MODE="offline", HF_HUB_OFFLINE="1", **ONE_THREAD,
             PATH=str(Path(sys.executable).parent) + os.pathsep + e.get("PATH", ""))
    venv = Path(sys.executable).parent.parent
    base = venv_base(venv)
    assert base is not None, f"{venv} is not a venv: the job's interpreter must be one the stand-in can mount"
    mounts = {
        "checkout": f"{REPO}:{REPO}:ro",  # hpc_grpo (PYTHONPATH or the editable install) and the venv's link
        "venv": f"{venv.resolve()}:{venv.resolve()}:ro",
        "python": f"{base}:{base}:ro",  # the Python the venv was made from (the stand-in's image lacks it)
        "data": f"{root / 'data'}:{root / 'data'}:ro",
        "model": f"{model}:{model}:ro",
    }
    tiny = ["recipe=tiny-gsm8k", f"data.train_files={data.trl_train}", f"data.val_files={data.trl_test}",
            f"model.path={model}", f"cluster.runs_root={root / 'runs'}", "cluster.setup.container=standin.sqsh",
            # slurm-dev's shared path is /tmp, which holds everything here: mounted, it would show it all
            "cluster.shared_paths=[]",
            f"cluster.setup.container_launcher={STANDIN}", f"cluster.setup.python={sys.executable}"]
    return Env(root, e, root / "data", tiny, mounts, tag=f"{os.getpid():x}{int(time.time()) % 100000:x}")


def log_of(run_dir: Path, job_id: str) -> str:
    out, err = layout.job_log(run_dir, job_id), layout.job_log(run_dir, job_id, err=True)
    return "".join(p.read_text(errors="replace") for p in (out, err) if p.is_file())


def metric_steps(run_dir: Path) -> list[int]:
    path = layout.metrics_file(run_dir)
    steps = []
    for line in path.read_text().splitlines() if path.is_file() else []:
        try:
            steps.append(int(json.loads(line)["step"]))
        except (ValueError, KeyError):
            pass  # a line being written
    return steps


def submitted_job(run_dir: Path) -> str:
    return [h for h in runs.read_history(run_dir) if h.purpose == "train"][0].job_id


def test_the_standin_shows_only_its_mounts_and_no_slurm_client(env: Env) -> None:
    """The test double itself: what these tests rely on it to hide is hidden."""
    data = env.mounts["data"]
    probe = (f"ls {env.data}/trl >/dev/null && echo data-seen; ls {env.root / 'models'} 2>/dev/null || echo models-hidden;"
             f" ls {REPO} 2>/dev/null || echo checkout-hidden; touch {env.data}/x 2>/dev/null || echo data-read-only;"
             " scontrol ping; echo scontrol=$?")
    proc = subprocess.run([str(STANDIN), "--container-image=standin.sqsh", f"--container-mounts={data}",
                           "--no-container-mount-home", "--", "/bin/sh", "-c", probe],
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["data-seen", "models-hidden", "checkout-hidden", "data-read-only", "scontrol=127"]
    assert "scontrol: command not found" in proc.stderr


def test_a_job_that_mounts_what_it_reads_finishes(env: Env) -> None:
    name = env.name("mounted")
    proc = env.cli("submit", "cluster=slurm-dev", *env.tiny, *TINY, env.mount_override(), "--name", name, "--no-wait")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    run_dir = env.runs_root() / name
    script = layout.sbatch_script(run_dir).read_text()
    srun = next(line for line in script.splitlines() if line.startswith("srun "))
    assert f"{STANDIN} --container-image=standin.sqsh --container-mounts=" in srun
    assert f"{env.data}:{env.data}:ro" in srun and f"{run_dir}:{run_dir}" in srun
    assert "/tmp:/tmp" not in srun
    job_id = submitted_job(run_dir)
    info = wait_final(job_id, DEADLINE_S)
    assert info.state == "COMPLETED", (info, log_of(run_dir, job_id)[-3000:])
    assert metric_steps(run_dir)[-1] == 4
    assert (layout.checkpoints_dir(run_dir) / "checkpoint-4").is_dir()


def test_plan_refuses_a_profile_missing_the_data_mount(env: Env) -> None:
    name = env.name("no-data-mount")
    proc = env.cli("submit", "cluster=slurm-dev", *env.tiny, *TINY, env.mount_override(leave_out="data"),
                   "--name", name, "--no-wait")
    text = " ".join((proc.stdout + proc.stderr).split())  # rich wraps table cells
    assert proc.returncode == 1, text
    assert "Nothing submitted" in text
    train = env.data / Path(env.tiny[1].split("=", 1)[1]).relative_to(env.data)
    assert f"data.train_files: {train} is not inside the container" in text, text
    assert f"cluster.setup.mounts: [{train.parent}]" in text, text
    assert "model.path" not in text.split("Findings:")[-1].split("error: data")[0]  # the model's mount is there
    assert not (env.runs_root() / name / layout.HISTORY_FILE).exists()


def test_without_plan_the_missing_mount_kills_the_job_in_the_standin(env: Env) -> None:
    """Submitted past plan (resolve, render, submit_run: what submit does after its plan): the stand-in hides the
    data, so the job dies at its start; this is what plan's refusal saves a user from."""
    name = env.name("unplanned")
    overrides = [o for o in [*env.tiny, *TINY, env.mount_override(leave_out="data")] if not o.startswith("recipe=")]
    code = ("import sys\n"
            "from hpc_grpo.config.resolve import resolve_spec\n"
            "from hpc_grpo.launch import render, submit\n"
            "spec = resolve_spec('tiny-gsm8k', 'slurm-dev', sys.argv[2:], run_name=sys.argv[1])\n"
            "print(submit.submit_run(spec, render.render_all(spec)).job_id)\n")
    proc = subprocess.run([sys.executable, "-c", code, name, *overrides], capture_output=True, text=True,
                          env=env.env, cwd=env.root, timeout=120, stdin=subprocess.DEVNULL, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    job_id = proc.stdout.split()[-1]
    run_dir = env.runs_root() / name
    info = wait_final(job_id, DEADLINE_S)
    log = log_of(run_dir, job_id)
    assert info.state == "FAILED", (info, log[-3000:])
    train = env.tiny[1].split("=", 1)[1]
    assert f"data.train_files {train} does not exist" in log, log[-3000:]
    assert metric_steps(run_dir) == []
    assert Path(train).is_file()  # the file is there on the host: only the container does not see it


def test_usr2_saves_and_requeues_through_the_batch_script(env: Env) -> None:
    """USR2 (what the time-limit warning sends) inside a container whose image has no scontrol: the job saves,
    asks its batch script for the requeue, and the requeued job resumes from the saved step and finishes."""
    name = env.name("usr2")
    steps = ["train.total_training_steps=30", "checkpoint.save_freq=25", "eval.enabled=false", "batch.train=2",
             "batch.mini=2", "batch.micro_per_gpu=4", "batch.log_prob_micro_per_gpu=4", "grpo.n=2",
             "data.max_response_length=8"]
    proc = env.cli("submit", "cluster=slurm-dev", *env.tiny, *steps, env.mount_override(), "--name", name,
                   "--no-wait")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    run_dir = env.runs_root() / name
    job_id = submitted_job(run_dir)
    end = time.monotonic() + DEADLINE_S
    while len(metric_steps(run_dir)) < 3:
        state = slurm.job_states([job_id]).get(job_id)
        assert state is None or state.live, (state, log_of(run_dir, job_id)[-3000:])
        assert time.monotonic() < end, f"job {job_id} logged no 3 steps in time"
        time.sleep(0.2)
    slurm.cancel(job_id, signal="USR2")
    info = wait_final(job_id, DEADLINE_S)
    log = log_of(run_dir, job_id)
    assert info.state == "COMPLETED", (info, log[-3000:])
    history = [h for h in runs.read_history(run_dir) if h.purpose not in runs.EVENTS]
    assert [(h.job_id, h.purpose) for h in history] == [(job_id, "train"), (job_id, "requeue")], history
    note = history[1].note
    assert "saved step" in note and "? s were left" not in note, note  # time left estimated without squeue
    saved = json.loads(layout.save_marker(run_dir).read_text())["step"]
    starts = [h.note for h in runs.read_history(run_dir) if h.purpose == "start"]
    assert len(starts) == 2 and f"checkpoint-{saved}" in starts[1], starts
    assert "requeue asked of the batch script" in log, log[-3000:]
    assert metric_steps(run_dir)[-1] == 30
    assert not layout.requeue_request(run_dir, job_id).exists()
