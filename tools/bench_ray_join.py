#!/usr/bin/env python3
"""Benchmark: time from the batch script's start until every Ray node of the job has joined, on slurm-dev.

Submits recipe ray-probe (the verl launch path with hpc_grpo.job.ray_probe as its driver) at 2 and 4 nodes,
--repeat times each, one job at a time, through the real CLI into a temporary runs root. Per job:
  start   the batch script's start: the birth time of its stdout file (<job>_0_log.out), which slurmstepd
          creates just before it runs the script (fallback: submitit's first log line, about 0.5 s later)
  joined  when hpc_grpo.job.ray_wait saw every node and GPU (its marker file ray/<job>/joined.<restart count>)
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
import threading
import time
from datetime import datetime
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from hpc_grpo.cluster import slurm  # noqa: E402
from hpc_grpo.job.ray_probe import leftover_pids  # noqa: E402

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


class CpuSampler(threading.Thread):
    """Samples the host's /proc/stat every 0.1 s, to tell how much CPU the join window had and used."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.samples: list[tuple[float, float, float]] = []  # (time, busy core-s, stolen core-s)
        self.tick = os.sysconf("SC_CLK_TCK")
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            with open("/proc/stat") as f:
                v = [int(x) for x in f.readline().split()[1:]]
            # user nice system idle iowait irq softirq steal ...
            busy = v[0] + v[1] + v[2] + v[5] + v[6]
            self.samples.append((time.time(), busy / self.tick, (v[7] if len(v) > 7 else 0) / self.tick))
            time.sleep(0.1)

    def between(self, t0: float, t1: float) -> tuple[float, float]:
        """(busy, stolen) core-seconds between two epoch times."""
        inside = [s for s in self.samples if t0 <= s[0] <= t1]
        if len(inside) < 2:
            return float("nan"), float("nan")
        return inside[-1][1] - inside[0][1], inside[-1][2] - inside[0][2]


def run_one(root: Path, env: dict[str, str], nodes: int, name: str, cpu: CpuSampler) -> dict:
    argv = [sys.executable, "-m", "hpc_grpo.cli.app", "submit", "recipe=ray-probe", "cluster=slurm-dev",
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
    busy, stolen = cpu.between(start, joined["time"]) if start and joined else (float("nan"), float("nan"))
    return {
        "cpu_busy": busy, "cpu_stolen": stolen,
        "name": name, "job_id": job_id, "state": info.state, "nodes": nodes,
        "join_s": None if joined is None or start is None else joined["time"] - start,
        "launch_s": None if launch is None or start is None else launch - start,
        "teardown_s": None if driver_end is None or stopped is None else stopped - driver_end,
        "start_src": start_src, "joined": joined,
        "probe": json.loads(probe.read_text()) if probe.is_file() else None,
        "leftovers": sorted(leftover_pids(job_id, run_dir)), "elapsed_s": info.elapsed_s,
    }


def _start_time(pid: int) -> str | None:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return None if fields[0] == "Z" else fields[19]


def _tree(pid: int) -> list[int]:
    kids: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            kids.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], [pid]
    while todo:
        for child in kids.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def bare_head_floor(base: int = 33000) -> float | None:
    """Seconds from `ray start --head` (same flags as launch.sh, no Slurm, nothing else running from us) until its
    raylet is registered in GCS: Ray's own start-up on this host, a floor for any bootstrap. Ports base..base+99
    (outside the job blocks 20000-31999), 127.0.0.11, its own temp dir; stops only the processes it started."""
    tmp = Path(tempfile.mkdtemp(prefix="hpc-grpo-bench-floor-"))
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "0",
           "PATH": str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", "")}
    env.pop("RAY_ADDRESS", None)
    ports = {"node-manager-port": 1, "object-manager-port": 2, "dashboard-agent-listen-port": 3,
             "dashboard-agent-grpc-port": 4, "metrics-export-port": 5, "runtime-env-agent-port": 6,
             "dashboard-port": 8, "min-worker-port": 50, "max-worker-port": 99}
    argv = ["ray", "start", "--head", f"--port={base}", "--node-ip-address=127.0.0.11", "--num-gpus=4",
            "--num-cpus=4", f"--temp-dir={tmp}", "--disable-usage-stats", "--include-log-monitor=false",
            "--include-dashboard=false", "--no-monitor", "--block", *(f"--{k}={base + v}" for k, v in ports.items())]
    t0 = time.time()
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    took = None
    tree: list[int] = []
    try:
        import ray  # noqa: F401
        from ray._raylet import GcsClient

        deadline = time.monotonic() + 120
        client = None
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                client = client or GcsClient(address=f"127.0.0.11:{base}")
                if any(n.state == 0 for n in client.get_all_node_info(timeout=2).values()):
                    took = time.time() - t0
                    break
            except Exception:  # noqa: BLE001 - not up yet
                pass
            time.sleep(0.05)
    finally:
        tree = [(pid, _start_time(pid)) for pid in _tree(proc.pid)]
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
        time.sleep(2)
        for pid, started in tree:  # our own children only (agents can outlive the raylet), same process only
            if started is not None and _start_time(pid) == started:
                try:
                    os.kill(pid, 9)
                except OSError:
                    pass
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)
    return took


def fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--nodes", type=int, nargs="+", default=[2, 4])
    p.add_argument("--keep", action="store_true", help="keep the temporary runs root (its path is printed)")
    p.add_argument("--floor", type=int, default=0, metavar="K",
                   help="also time K bare `ray start --head` runs on this host (no Slurm): Ray's own start-up")
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
    cpu = CpuSampler()
    cpu.start()
    cores = os.cpu_count() or 1
    print(f"host: {cores} CPU(s), load average {open('/proc/loadavg').read().split()[0]} at the start; "
          "the emulated nodes share these CPUs", flush=True)
    for n in a.nodes:
        for i in range(a.repeat):
            r = run_one(root, env, n, f"bench-n{n}-{i}", cpu)
            results.setdefault(n, []).append(r)
            ok = (r["state"] == "COMPLETED" and r["probe"] is not None and r["probe"]["nodes_alive"] == n
                  and not r["leftovers"])
            failed |= not ok
            print(f"N={n} #{i}: job {r['job_id']} {r['state']}  join {fmt(r['join_s'])} s (start from "
                  f"{r['start_src']})  launch.sh at +{fmt(r['launch_s'])} s  teardown {fmt(r['teardown_s'])} s  "
                  f"job {r['elapsed_s']} s  "
                  f"probe {r['probe'] and (r['probe']['nodes_alive'], r['probe']['gpus_total'])}"
                  f"  leftovers {r['leftovers'] or 'none'}", flush=True)
            if r["join_s"]:
                print(f"        CPU in the join window: {r['cpu_busy']:.1f} core-s busy of {cores * r['join_s']:.1f} "
                      f"available, {r['cpu_stolen']:.1f} stolen by the hypervisor", flush=True)
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
    if a.floor:
        floors = [bare_head_floor() for _ in range(a.floor)]
        print(f"\nbare `ray start --head` on this host until its raylet registered (no Slurm, no other node): "
              f"{', '.join(fmt(f) for f in floors)} s")
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
