"""One interpreter for every in-job step, even when the compute node's PATH holds another python3.

Submitted with `PATH=/usr/bin:/bin`, whose python3 cannot import hpc_grpo (asserted first), as after a pipx install
or from a venv that is not activated on the compute node. The jobs must still run, on the interpreter frozen in
spec.yaml (`python`): a 2-node Ray probe (submitit's task, Ray's CLI on both nodes, the join wait and the driver) and a
tiny trl job. Real Slurm, real submitit, real Ray; the test cancels only its own jobs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hpc_grpo.runstate import runs
from tests.conftest import ONE_THREAD
from tests.slurm.jobs import wait_final
from hpc_grpo.config.resolve import load_frozen

pytestmark = [pytest.mark.slurm, pytest.mark.usefixtures("slurm_cluster")]

REPO = Path(__file__).resolve().parents[2]
GSM8K = REPO.parent / "shared" / "data" / "gsm8k"
BARE_PATH = "/usr/bin:/bin"
DEADLINE_S = 420.0  # a 2-node probe takes about 20 s, the tiny trl job about 30 s; room for a busy shared cluster


@pytest.fixture(scope="module")
def bare_env(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    """A user's environment whose PATH python3 lacks hpc_grpo; cwd outside the checkout (no '' import of it)."""
    root = tmp_path_factory.mktemp("interp")
    home = root / "home"
    home.mkdir()
    drop = {"WANDB_API_KEY", "HF_TOKEN", "HPC_GRPO_PATH", "RAY_ADDRESS", "PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME"}
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env.update(HOME=str(home), WANDB_MODE="offline", HF_HUB_OFFLINE="1", **ONE_THREAD, PATH=BARE_PATH)
    probe = subprocess.run(["python3", "-c", "import hpc_grpo"], env=env, cwd=root, capture_output=True, text=True,
                           timeout=60, check=False)
    assert probe.returncode != 0 and "No module named 'hpc_grpo'" in probe.stderr, (
        "the test needs a PATH whose python3 cannot import hpc_grpo", probe)
    return root, env


def submit(root: Path, env: dict[str, str], *args: str) -> tuple[Path, str]:
    name = f"interp-{os.getpid():x}-{int(time.time() * 1000) % 10**7:x}"
    proc = subprocess.run([sys.executable, "-m", "hpc_grpo.cli.app", "submit", "cluster=slurm-dev",
                           f"cluster.runs_root={root / 'runs'}", *args, "--name", name, "--no-wait"],
                          capture_output=True, text=True, env=env, cwd=root, timeout=180, stdin=subprocess.DEVNULL,
                          check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    run_dir = root / "runs" / name
    return run_dir, runs.last_job_id(run_dir)


def logs(run_dir: Path, job_id: str) -> str:
    return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}"
                     for p in sorted((run_dir / "submitit").glob(f"{job_id}_*_log.*")))


def test_ray_probe_runs_on_the_frozen_interpreter(bare_env: tuple[Path, dict[str, str]]) -> None:
    root, env = bare_env
    out = root / "probe.json"
    run_dir, job_id = submit(root, env, "recipe=ray-probe", "resources.nodes=2",
                             f"launch.driver=[python3,-m,hpc_grpo.job.ray_probe,--out,{out}]")
    spec = load_frozen(run_dir / "spec.yaml")
    assert spec.python == sys.executable  # no venv/conda/container in slurm-dev: the submitting interpreter
    launch = (run_dir / "scripts" / "launch.sh").read_text()
    assert "python3 " not in launch.replace("python3 -c 'import hpc_grpo'", "")  # every step via "$python"
    info = wait_final(job_id, DEADLINE_S)
    assert info.state == "COMPLETED", (info, logs(run_dir, job_id))
    probe = json.loads(out.read_text())
    assert probe["nodes_alive"] == 2 and probe["gpus_total"] == 8, probe
    assert "No module named" not in logs(run_dir, job_id)


def test_trl_job_runs_on_the_frozen_interpreter(bare_env: tuple[Path, dict[str, str]]) -> None:
    if not GSM8K.is_dir():
        pytest.fail(f"{GSM8K} is missing: the GSM8K files live in ../shared beside the checkout", pytrace=False)
    from hpc_grpo.data.gsm8k import prepare_gsm8k

    root, env = bare_env
    data = prepare_gsm8k(GSM8K, root / "data")
    run_dir, job_id = submit(root, env, "recipe=tiny-gsm8k", "eval.enabled=false", f"data.train_files={data.trl_train}",
                             f"data.val_files={data.trl_test}", f"model.path={root / 'models' / 'tiny-qwen2'}",
                             "train.total_training_steps=2", "checkpoint.save_freq=2")
    info = wait_final(job_id, DEADLINE_S)
    assert info.state == "COMPLETED", (info, logs(run_dir, job_id))
    done = json.loads((run_dir / "train_done.json").read_text())
    assert done, done
    assert (run_dir / "checkpoints" / "checkpoint-2").is_dir(), sorted(p.name for p in run_dir.rglob("*"))[:50]
