#!/usr/bin/env python3
"""Benchmark: time from the batch script's start until every Ray node of the job has joined, on slurm-dev.

Submits recipe ray-probe (the verl launch path with hpc_grpo.ray_probe as its driver) at 2 and 4 nodes,
--repeat times each, one job at a time, through the real CLI into a temporary runs root. Per job:
  start   the batch script's start: the birth time of its stdout file (<job>_0_log.out), which slurmstepd
          creates just before it runs the script (fallback: submitit's first log line, about 0.5 s later)
  joined  when hpc_grpo.ray_wait saw every node and GPU (its marker file ray/<job>/joined.<restart count>)
The table sets the join time beside the fixed sleeps of verl's multi-node example (10 + 5 x (N - 1) s)
with the ratio, and the target: at most a third of those sleeps. PASS needs every repeat within the target.
Also printed: the launch script's own start, the driver's end -> Ray head stopped (teardown), and whether
any process of the job's Ray temp dir (/tmp/hpc-grpo-ray-<job>-<node>) is left afterwards.

Run from the repository with the venv active and the cluster up:
  bash tools/slurm-dev/start.sh && source .slurm-dev/env.sh && python tools/bench_ray_join.py
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from hpc_grpo import slurm  # noqa: E402

JOB_DEADLINE_S = 240.0
LOG_TS = re.compile(r"^hpc-grpo: \[(\d+\.\d+)\] (.*)$", re.M)
SUBMITIT_TS = re.compile(r"^submitit INFO \((\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})\) - Starting with", re.M)


def verl_sleep_s(nodes: int) -> float:
    """verl's examples/ray multi-node script: sleep 10 after the head, then 5 s per worker node."""
    return 10.0 + 5.0 * (nodes - 1)


def job_env(home: Path) -> dict[str, str]:
    env = dict(os.environ)
    venv_bin = str(Path(sys.executable).parent)
    env.update(HOME=str(home), WANDB_MODE="offline", HF_HUB_OFFLINE="1",
               PATH=venv_bin + os.pathsep + env.get("PATH", ""))
    return env


def birth_time(path: Path) -> float | None:
    proc = subprocess.run(["stat", "-c", "%.9W", str(path)], capture_output=True, text=True, check=False)
    try:
        value = float(proc.stdout.strip())
    except ValueError:
        return None
    return value if value > 0 else None


def leftover_pids(job_id: str) -> list[int]:
    """PIDs whose command line names this job's Ray temp dir (inspects /proc only; kills nothing)."""
    needle = f"/tmp/hpc-grpo-ray-{job_id}-".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if needle in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def run_one(root: Path, env: dict[str, str], nodes: int, name: str) -> dict:
    argv = [sys.executable, "-m", "hpc_grpo.cli", "submit", "recipe=ray-probe", "cluster=slurm-dev",
            f"cluster.runs_root={root}", f"resources.nodes={nodes}", "--name", name, "--no-wait"]
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=root.parent, timeout=120, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"submit failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    run_dir = root / name
    job_id = json.loads((run_dir / "history.jsonl").read_text().splitlines()[-1])["job_id"]
    end = time.monotonic() + JOB_DEADLINE_S
    while True:
        info = slurm.job_states([job_id]).get(job_id)
        if info is not None and not info.live:
            break
        if time.monotonic() > end:
            slurm.cancel(job_id)
            raise SystemExit(f"job {job_id} ({name}) not finished after {JOB_DEADLINE_S:.0f}s: {info}")
        time.sleep(0.5)
    log0 = run_dir / "submitit" / f"{job_id}_0_log.out"
    text = log0.read_text(errors="replace")
    start = birth_time(log0)
    start_src = "btime"
    if start is None:
        m = SUBMITIT_TS.search(text)
        start = datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp() if m else None
        start_src = "submitit"
    marker = run_dir / "ray" / job_id / "joined.0"
    joined = json.loads(marker.read_text()) if marker.is_file() else None
    events = {msg: float(ts) for ts, msg in LOG_TS.findall(text)}

    def at(prefix: str) -> float | None:
        return next((t for msg, t in events.items() if msg.startswith(prefix)), None)

    launch, driver_end, stopped = at("starting the Ray head"), at("driver exited"), at("Ray head stopped")
    probe = run_dir / "probe.json"
    time.sleep(1.0)  # the job is over; give the last children a moment before looking for leftovers
    return {
        "name": name, "job_id": job_id, "state": info.state, "nodes": nodes,
        "join_s": None if joined is None or start is None else joined["time"] - start,
        "launch_s": None if launch is None or start is None else launch - start,
        "teardown_s": None if driver_end is None or stopped is None else stopped - driver_end,
        "start_src": start_src, "joined": joined,
        "probe": json.loads(probe.read_text()) if probe.is_file() else None,
        "leftovers": leftover_pids(job_id), "elapsed_s": info.elapsed_s,
    }


def fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--nodes", type=int, nargs="+", default=[2, 4])
    p.add_argument("--keep", action="store_true", help="keep the temporary runs root (its path is printed)")
    a = p.parse_args()
    if not slurm.available():
        print("no Slurm controller answers: start tools/slurm-dev/start.sh and `source .slurm-dev/env.sh`",
              file=sys.stderr)
        return 2
    tmp = Path(tempfile.mkdtemp(prefix="hpc-grpo-bench-ray-"))
    (tmp / "home").mkdir()
    root = tmp / "runs"
    env = job_env(tmp / "home")
    results: dict[int, list[dict]] = {}
    failed = False
    for n in a.nodes:
        for i in range(a.repeat):
            r = run_one(root, env, n, f"bench-n{n}-{i}")
            results.setdefault(n, []).append(r)
            ok = (r["state"] == "COMPLETED" and r["probe"] is not None and r["probe"]["nodes_alive"] == n
                  and not r["leftovers"])
            failed |= not ok
            print(f"N={n} #{i}: job {r['job_id']} {r['state']}  join {fmt(r['join_s'])} s (start from "
                  f"{r['start_src']})  launch.sh at +{fmt(r['launch_s'])} s  teardown {fmt(r['teardown_s'])} s  "
                  f"job {r['elapsed_s']} s  probe {r['probe'] and (r['probe']['nodes_alive'], r['probe']['gpus_total'])}"
                  f"  leftovers {r['leftovers'] or 'none'}", flush=True)
    print()
    head = f"{'nodes':>5} | {'join s (each)':<22} | {'median':>6} | {'worst':>6} | {'verl sleep':>10} | " \
           f"{'ratio':>6} | {'target':>6} | verdict"
    print(head)
    print("-" * len(head))
    for n, rows in results.items():
        times = [r["join_s"] for r in rows if r["join_s"] is not None]
        if len(times) != len(rows):
            print(f"{n:>5} | some runs have no join time: {[r['name'] for r in rows if r['join_s'] is None]}")
            failed = True
            continue
        sleep = verl_sleep_s(n)
        med, worst = statistics.median(times), max(times)
        target = sleep / 3
        verdict = "PASS" if worst <= target else "MISS"
        print(f"{n:>5} | {', '.join(f'{t:.2f}' for t in times):<22} | {med:>6.2f} | {worst:>6.2f} | "
              f"{sleep:>10.1f} | {med / sleep:>6.2f} | {target:>6.1f} | {verdict}")
    print("\nratio = median join time / verl's fixed sleep; target = a third of the sleep; "
          "verdict PASS when every repeat is within the target")
    if a.keep:
        print(f"runs kept in {root}")
    else:
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
