"""verl's real trainer on cluster=local (no Slurm): the same launch path as on Slurm (scripts/launch.sh ->
hpc_grpo.job.verl_node), one node at the profile's loopback address 127.0.0.2, job id from submitit's local
executor. The submitting HOME holds a stray ~/.ray/auth_token, as a driver that once started its own Ray (verl's
main_ppo with ray_init.address=local) leaves behind on a shared home: every Ray of the job must still agree on one
authentication mode (hpc_grpo.job.node_plan.auth_mode), or the driver dies on "InvalidAuthToken".

Needs the full verl stack (.venv-verl: HPC_GRPO_VERL_VENV, else <repo>/.venv-verl; `bash tools/setup-env.sh verl`):
skipped without it, and failed under CI=true. The test builds the tiny model and verl's GSM8K files itself (from
../shared/data/gsm8k beside the checkout). The job runs this checkout's hpc_grpo (PYTHONPATH), whatever the venv has
installed. A few minutes on 2 cores.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
VENV = Path(os.environ.get("HPC_GRPO_VERL_VENV") or REPO / ".venv-verl")
GSM8K = REPO.parent / "shared" / "data" / "gsm8k"
STRAY_TOKEN = "stray-token-from-an-earlier-local-ray-0123456789abcdef"
LOG_TS = re.compile(r"^hpc-grpo: \[(\d+\.\d+)\] (.*)$", re.M)


def _venv() -> Path:
    if not (VENV / "bin" / "python").exists():
        msg = f"needs the full verl stack at {VENV} (bash tools/setup-env.sh verl)"
        if os.environ.get("CI") == "true":
            pytest.fail(msg, pytrace=False)
        print(f"SKIP: {msg}")
        pytest.skip(msg)
    return VENV


def test_tiny_verl_trains_on_cluster_local_despite_a_stray_ray_token(tmp_path: Path) -> None:
    venv = _venv()
    from hpc_grpo.data.gsm8k import prepare_gsm8k
    from hpc_grpo.data.tiny_model import ensure_tiny_model

    model = ensure_tiny_model(tmp_path / "models" / "tiny-qwen2")
    data = prepare_gsm8k(GSM8K, tmp_path / "data")
    home = tmp_path / "home"
    (home / ".ray").mkdir(parents=True)
    token = home / ".ray" / "auth_token"
    token.write_text(STRAY_TOKEN)
    drop = {"WANDB_API_KEY", "HF_TOKEN", "HPC_GRPO_PATH", "RAY_ADDRESS", "RAY_AUTH_MODE", "VIRTUAL_ENV",
            "SLURM_JOB_ID", "SLURM_CONF"}
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env.update(HOME=str(home), WANDB_MODE="offline", HF_HUB_OFFLINE="1", PYTHONPATH=str(REPO))
    run = tmp_path / "runs" / "tv"
    argv = [sys.executable, "-m", "hpc_grpo.cli.app", "submit", "recipe=tiny-verl", "cluster=local",
            f"cluster.setup.venv={venv}", f"cluster.runs_root={tmp_path / 'runs'}", f"model.path={model}",
            f"data.train_files={data.verl_train}", f"data.val_files={data.verl_test}",
            "train.total_training_steps=2", "eval.enabled=false", "--name", "tv", "--wait"]
    proc = subprocess.run(argv, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=1500,
                          stdin=subprocess.DEVNULL, check=False)
    logs = "\n".join(p.read_text(errors="replace") for p in sorted((run / "submitit").glob("*_log.*")))
    assert proc.returncode == 0, (proc.stdout[-3000:], proc.stderr[-3000:], logs[-6000:])

    # Trained: verl's checkpoints of both steps, its metrics copied by the prune poller.
    ckpts = run / "checkpoints"
    assert (ckpts / "global_step_1").is_dir() and (ckpts / "global_step_2").is_dir(), sorted(os.listdir(ckpts))
    assert (ckpts / "latest_checkpointed_iteration.txt").read_text().strip() == "2"
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    assert {r.get("step") for r in rows} >= {1, 2}, rows[:3]

    # The launch path: no Slurm, the job's Ray on 127.0.0.2 in its own port block, torn down in order.
    out = "\n".join(p.read_text(errors="replace") for p in sorted((run / "submitit").glob("*_0_log.out")))
    job_id = next(p.name.split("_")[0] for p in (run / "submitit").glob("*_0_log.out"))
    base = 20000 + (int(job_id) % 30) * 400
    events = [msg for _, msg in LOG_TS.findall(out)]
    assert f"starting the Ray head on {os.uname().nodename} (127.0.0.2:{base}) for 1 node(s)" in events, events
    assert "all 1 node(s) joined; starting the driver" in events and "driver exited with status 0" in events
    assert events[-1] == "Ray head stopped", events[-5:]
    assert not Path(f"/tmp/hpc-grpo-ray-{job_id}-0").exists()

    # One authentication mode for every Ray of the job, and the stray token neither used against it nor removed.
    assert not re.search(r"InvalidAuthToken|[Aa]uthentication token|Token authentication is enabled", logs)
    assert token.read_text() == STRAY_TOKEN
