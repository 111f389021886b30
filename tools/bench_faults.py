#!/usr/bin/env python3
"""Benchmark: per fault, the time from the fault to the first resumed training step, and the steps lost.

Runs the tiny trl recipe (shrunk: 4 prompts x 4 completions, 16 new tokens) on slurm-dev through the real CLI,
into a temporary runs root, one run per fault, and hits it after --fault-after logged steps with:
  usr2        `scancel --signal=USR2` (what preemption and the time-limit warning send)
  time-limit  a real time limit: resources.time=2, cluster.signal_delay_s=75 (the warning comes on its own)
  requeue     `scontrol requeue` (SIGTERM, no save: the run resumes from its newest periodic checkpoint)
  preemption  a job in the `high` partition that needs the run's node
Measured from metrics.jsonl (one line per step, with its wall-clock time), polled every 0.1 s:
  resumed step K   the step the new attempt resumes from: the save on the signal (signal_save.json) or,
                   for `scontrol requeue`, the newest complete checkpoint
  time             fault -> the first line of step K+1 written after the fault (the resumed attempt's first
                   step; the fault time of the time limit is when the trainer got the signal)
  steps lost       the highest step logged before the resume, minus K
Target: under 30 s for the signal cases and 0 steps lost with save-on-signal; `scontrol requeue` loses at
most save_freq steps. Each run is cancelled once measured.

  bash tools/slurm-dev/start.sh && source .slurm-dev/env.sh && .venv/bin/python tools/bench_faults.py
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from hpc_grpo.runstate import runs  # noqa: E402
from hpc_grpo.cluster import slurm  # noqa: E402
from hpc_grpo.runstate import checkpoints as ck  # noqa: E402
from hpc_grpo.runstate import save_request  # noqa: E402

SHRINK = ["checkpoint.keep_last=2", "grpo.entropy_coeff=0.01", "batch.train=2", "batch.mini=2", "batch.micro_per_gpu=4",
          "batch.log_prob_micro_per_gpu=4", "grpo.n=2", "data.max_response_length=8"]
FAULTS = ("usr2", "time-limit", "requeue", "preemption")
SIGNAL_TARGET_S = 30.0
DEADLINE_S = 420.0


def rows(run_dir: Path) -> list[dict]:
    out = []
    path = run_dir / "metrics.jsonl"
    for line in path.read_text().splitlines() if path.is_file() else []:
        try:
            out.append(json.loads(line))
        except ValueError:
            pass
    return out


def preempt(job_id: str, name: str) -> str:
    """A high-partition job needing one CPU more than is idle on the run's node."""
    node = slurm.job_states([job_id])[job_id].nodelist
    cpus = subprocess.run(["sinfo", "--noheader", "-n", node, "-o", "%C"], capture_output=True, text=True,
                          timeout=20, check=True).stdout.split()[0]
    idle, total = int(cpus.split("/")[1]), int(cpus.split("/")[3])
    proc = subprocess.run(["sbatch", "--parsable", "-p", "high", "-w", node, "-c", str(min(total, idle + 1)), "-t", "1",
                           "-J", name, "-o", "/dev/null", "--wrap", "sleep 3"],
                          capture_output=True, text=True, timeout=20, check=True)
    return proc.stdout.strip().split(";")[0]


def measure(fault: str, root: Path, base: list[str], env: dict[str, str], fault_after: int, steps: int,
            save_freq: int) -> dict:
    name = f"bench-{fault}-{os.getpid()}-{int(time.time()) % 100000}"
    extra = [f"train.total_training_steps={steps}", f"checkpoint.save_freq={save_freq}"]
    if fault == "time-limit":
        extra += ["resources.time=2", "cluster.signal_delay_s=75"]
    proc = subprocess.run([sys.executable, "-m", "hpc_grpo.cli.app", "submit", "cluster=slurm-dev",
                           f"cluster.runs_root={root / 'runs'}", *base, *SHRINK, *extra, "--name", name, "--no-wait"],
                          capture_output=True, text=True, env=env, cwd=root, timeout=180, check=False)
    if proc.returncode != 0:
        raise SystemExit(proc.stdout + proc.stderr)
    run_dir = root / "runs" / name
    job_id = runs.read_history(run_dir)[0].job_id
    cleanup: list[str] = [job_id]
    try:
        end = time.monotonic() + DEADLINE_S
        seen = 0
        while fault != "time-limit" and len(rows(run_dir)) < fault_after:
            if time.monotonic() > end:
                raise SystemExit(f"{fault}: job {job_id} logged no {fault_after} steps in time")
            time.sleep(0.1)
        fault_at = time.time()
        resumed: int | None = None
        if fault == "usr2":
            slurm.cancel(job_id, signal="USR2")
        elif fault == "requeue":
            ckpt = ck.newest_complete(ck.list_checkpoints(run_dir, "trl"))
            resumed = ckpt.step if ckpt else 0
            seen = max([0, *(r["step"] for r in rows(run_dir))])
            slurm.requeue(job_id)
        elif fault == "preemption":
            cleanup.append(preempt(job_id, f"{name}-hi"))
        while True:
            table = rows(run_dir)
            marker = save_request.read_marker(run_dir)
            if resumed is None and marker is not None:
                resumed = int(marker["step"])
                if fault == "time-limit":
                    fault_at = float(marker["signal_at"])
            first = next((r for r in table if resumed is not None and r["step"] == resumed + 1
                          and r["time"] > fault_at), None)
            if first is None:  # every line so far is the first attempt's: what it trained
                seen = max([seen, *(r["step"] for r in table)])
            else:
                return {"fault": fault, "job": job_id, "resumed": resumed, "time_s": first["time"] - fault_at,
                        "lost": seen - resumed, "save_freq": save_freq}
            if time.monotonic() > end:
                raise SystemExit(f"{fault}: no resumed step of job {job_id} in time (resumed={resumed})")
            time.sleep(0.1)
    finally:
        for jid in cleanup:
            slurm.cancel(jid)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--faults", default=",".join(FAULTS), help=f"comma-separated, of {', '.join(FAULTS)}")
    parser.add_argument("--fault-after", type=int, default=3, help="logged steps before the fault")
    parser.add_argument("--steps", type=int, default=400, help="max_steps (each run is cancelled once measured)")
    parser.add_argument("--save-freq", type=int, default=2, help="periodic saves (what scontrol requeue falls back to)")
    args = parser.parse_args()
    from hpc_grpo.data.gsm8k import prepare_gsm8k
    from hpc_grpo.data.tiny_model import ensure_tiny_model

    root = Path(tempfile.mkdtemp(prefix="bench-faults-"))
    (root / "home").mkdir()
    data = prepare_gsm8k(REPO.parent / "shared" / "data" / "gsm8k" if (REPO.parent / "shared").is_dir()
                         else Path("/work/shared/data/gsm8k"), root / "data")
    train = root / "data" / "train-200.jsonl"  # the job tokenizes every prompt at start: keep start-up short
    train.write_text("".join(data.trl_train.read_text().splitlines(keepends=True)[:200]))
    model = ensure_tiny_model(root / "models" / "tiny-qwen2")
    base = ["recipe=tiny-gsm8k", f"data.train_files={train}", f"data.val_files={data.trl_test}",
            f"model.path={model}"]
    env = {k: v for k, v in os.environ.items() if k not in ("WANDB_API_KEY", "HF_TOKEN", "HPC_GRPO_PATH")}
    env.update(HOME=str(root / "home"), WANDB_MODE="offline", HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1",
               PATH=str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", ""))
    results = []
    for fault in args.faults.split(","):
        r = measure(fault, root, base, env, args.fault_after, args.steps, args.save_freq)
        print(f"{fault}: {r['time_s']:.1f} s, resumed from step {r['resumed']}, steps lost {r['lost']}", flush=True)
        results.append(r)
    print("\n| fault | fault -> first resumed step | steps lost | target | met? |\n|---|---|---|---|---|")
    ok = True
    for r in results:
        if r["fault"] == "requeue":
            target, met = f"lost <= save_freq ({r['save_freq']})", r["lost"] <= r["save_freq"]
        else:
            target, met = f"< {SIGNAL_TARGET_S:.0f} s, 0 lost", r["time_s"] < SIGNAL_TARGET_S and r["lost"] == 0
        ok &= met
        print(f"| {r['fault']} | {r['time_s']:.1f} s | {r['lost']} | {target} | {'met' if met else 'MISSED'} |")
    print(f"\n(runs in {root}; delete it when done)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
