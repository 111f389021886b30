"""The verl launch path across 2 and 4 emulated nodes of slurm-dev: the real Ray bootstrap, a probe as the driver.

recipe ray-probe replaces verl's trainer with hpc_grpo.job.ray_probe, which joins the job's Ray cluster (RAY_ADDRESS from
launch.sh) and writes what it sees. So the launch path (launch.sh -> hpc_grpo.job.verl_node) runs for real: head on node 0, workers on the
others, per-job ports and temp dirs, polling join (hpc_grpo.job.ray_wait), teardown. Each node must have joined with the
loopback address Slurm gives it (127.0.0.11-14), never 127.0.0.1 nor the machine's external address, and nothing of
the job's Ray may be left afterwards. The test only inspects /proc; it signals nothing but its own jobs (scancel).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hpc_grpo.runstate import runs
from tests.slurm.jobs import wait_final
from hpc_grpo.job.ray_probe import leftover_pids

# slurm_lead: the 4-node case needs every CPU of the cluster, so it runs before the chained run of test_signals.py
# takes a node for its ~3 minutes of time limits.
pytestmark = [pytest.mark.slurm, pytest.mark.slurm_lead, pytest.mark.usefixtures("slurm_cluster")]

JOB_DEADLINE_S = 300.0  # a 4-node probe takes about 30 s on 2 cores; room for a loaded machine and a queue
NODE_ADDRS = {f"node{i}": f"127.0.0.{10 + i}" for i in range(1, 5)}
LOG_TS = re.compile(r"^hpc-grpo: \[(\d+\.\d+)\] (.*)$", re.M)


def job_env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in {"WANDB_API_KEY", "HF_TOKEN", "RAY_ADDRESS"}}
    env.update(HOME=str(home), WANDB_MODE="offline", HF_HUB_OFFLINE="1",
               PATH=str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", ""))
    return env


def birth_time(path: Path) -> float | None:
    """When slurmstepd created the batch script's stdout, just before running it (statx birth time)."""
    proc = subprocess.run(["stat", "-c", "%.9W", str(path)], capture_output=True, text=True, check=False)
    try:
        value = float(proc.stdout.strip())
    except ValueError:
        return None
    return value if value > 0 else None


def logs(run_dir: Path, job_id: str) -> str:
    return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-4000:]}"
                     for p in sorted((run_dir / "submitit").glob(f"{job_id}_*_log.*")))


@pytest.mark.parametrize("nodes", [2, 4])
def test_ray_bootstrap_across_nodes(nodes: int, tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    root = tmp_path / "runs"
    name = f"probe-{nodes}n"
    run_dir = root / name
    out = run_dir / "probe.json"
    argv = [sys.executable, "-m", "hpc_grpo.cli.app", "submit", "recipe=ray-probe", "cluster=slurm-dev",
            f"cluster.runs_root={root}", f"resources.nodes={nodes}",
            f"launch.driver=[python3,-m,hpc_grpo.job.ray_probe,--out,{out}]", "--name", name, "--no-wait"]
    t0 = time.monotonic()
    proc = subprocess.run(argv, capture_output=True, text=True, env=job_env(home), cwd=tmp_path, timeout=180,
                          stdin=subprocess.DEVNULL, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    job_id = runs.last_job_id(run_dir)
    info = wait_final(job_id, JOB_DEADLINE_S)
    took = time.monotonic() - t0
    assert info.state == "COMPLETED", (info, logs(run_dir, job_id))

    # What the driver saw: every node, every GPU, each node on its own Slurm NodeAddr.
    probe = json.loads(out.read_text())
    assert probe["nodes_alive"] == nodes, probe
    assert probe["gpus_total"] == 4 * nodes, probe
    allocated = subprocess.run(["scontrol", "show", "hostnames", info.nodelist], capture_output=True, text=True,
                               check=True, timeout=20).stdout.split()
    addrs = [n["NodeManagerAddress"] for n in probe["nodes"]]
    assert sorted(addrs) == sorted(NODE_ADDRS[n] for n in allocated), (addrs, allocated)
    assert "127.0.0.1" not in addrs and all(a in NODE_ADDRS.values() for a in addrs)
    assert all(n["GPU"] == 4 for n in probe["nodes"])

    # Per-job ports: GCS at the job's block base, every node's raylet inside its own 100-port slot of the block.
    base = 20000 + (int(job_id) % 30) * 400
    assert probe["address"] == f"{NODE_ADDRS[allocated[0]]}:{base}"
    slots = sorted((n["NodeManagerPort"] - base) // 100 for n in probe["nodes"])
    assert slots == list(range(nodes)), probe["nodes"]

    # Per-job, per-node temp dirs; the join was polled (no fixed sleep) and every node left in order.
    text = {i: (run_dir / "submitit" / f"{job_id}_{i}_log.out").read_text(errors="replace") for i in range(nodes)}
    assert f"/tmp/hpc-grpo-ray-{job_id}-0/" in text[0]
    for i in range(1, nodes):
        assert f"/tmp/hpc-grpo-ray-{job_id}-{i}/" in text[i]
        assert "Ray worker stopped" in text[i]
    events = {msg: float(ts) for ts, msg in LOG_TS.findall(text[0])}
    assert any(m.startswith(f"all {nodes} node(s) joined") for m in events), text[0]
    assert any(m == "Ray head stopped" for m in events), text[0]
    assert not any(Path(f"/tmp/hpc-grpo-ray-{job_id}-{i}").exists() for i in range(nodes))

    # Nothing of the job's Ray is left (command line, open files under its temp dirs, or cwd in the run dir).
    end = time.monotonic() + 10
    while (left := leftover_pids(job_id, run_dir)) and time.monotonic() < end:
        time.sleep(0.5)
    assert not left, left

    joined = json.loads((run_dir / "ray" / job_id / "joined.0").read_text())
    start = birth_time(run_dir / "submitit" / f"{job_id}_0_log.out")
    join_s = joined["time"] - start if start else float("nan")
    teardown = [events[m] for m in events if m.startswith("driver exited")]
    print(f"\n{nodes} nodes: job {job_id} COMPLETED, submit -> final {took:.1f}s; batch start -> all joined "
          f"{join_s:.2f}s; driver exit -> head stopped {events['Ray head stopped'] - teardown[0]:.2f}s")
    assert joined["nodes"] == nodes and joined["gpus"] == 4 * nodes
