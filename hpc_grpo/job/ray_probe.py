"""A stand-in driver for the verl launch path: join the job's Ray cluster, record what it holds, exit 0.

Recipe ray-probe sets `launch.driver: [python3, -m, hpc_grpo.job.ray_probe]`, so the real bootstrap of
the verl launch path (launch.sh -> hpc_grpo.job.verl_node) runs (head on node 0, workers on the others, polling join) and this
probe checks its result without any training: nodes alive, GPUs in total, each node's address.
`ray.init()` takes the cluster from RAY_ADDRESS, which verl_node gives the driver only.
The JSON goes to --out (default: probe.json in the run directory, $HPC_GRPO_RUN_DIR).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from pathlib import Path

from hpc_grpo.cluster import job_env
from hpc_grpo.common.atomic import write_text_atomic
from hpc_grpo.runstate import layout


def probe() -> dict:
    import ray

    t0 = time.time()
    ray.init(logging_level=logging.ERROR, log_to_driver=False)
    try:
        alive = [n for n in ray.nodes() if n.get("Alive")]
        resources = ray.cluster_resources()
        job_id, executor = job_env.job_identity()
        return {
            "address": os.environ.get("RAY_ADDRESS", ""),
            "nodes_alive": len(alive),
            "gpus_total": int(resources.get("GPU", 0)),
            "cpus_total": int(resources.get("CPU", 0)),
            "nodes": [{"NodeManagerAddress": n.get("NodeManagerAddress"), "NodeManagerPort": n.get("NodeManagerPort"),
                       "GPU": int(n.get("Resources", {}).get("GPU", 0))} for n in alive],
            "slurm_job_id": job_id if executor == "slurm" else "",
            "init_s": round(time.time() - t0, 3),
            "time": time.time(),
        }
    finally:
        ray.shutdown()


def leftover_pids(job_id: str, run_dir: str | Path | None = None) -> dict[int, str]:
    """Processes still tied to a job's Ray, pid -> why; inspects /proc only and never signals anything.

    A process counts when its command line names the job's Ray temp dir (/tmp/hpc-grpo-ray-<job>-<node>), when
    one of its open files is under that dir (Ray's agents rename themselves to `ray::DashboardAgent`, so their
    command line no longer shows it, but their log files do, even deleted), or when its working directory is the
    run directory. Zombies are skipped: they hold nothing but a process-table slot.
    """
    needle = f"/tmp/hpc-grpo-ray-{job_id}-"
    run = str(Path(run_dir).resolve()) if run_dir else None
    found: dict[int, str] = {}
    me = os.getpid()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        try:
            stat = (entry / "stat").read_text()
            if stat.rsplit(")", 1)[1].split()[0] == "Z":
                continue
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            if needle in cmdline:
                found[int(entry.name)] = f"command line: {cmdline[:120]}"
                continue
            if run and os.readlink(entry / "cwd") == run:
                found[int(entry.name)] = f"cwd {run}: {cmdline[:120]}"
                continue
            for fd in (entry / "fd").iterdir():
                try:
                    target = os.readlink(fd)
                except OSError:
                    continue
                if target.startswith(needle):
                    found[int(entry.name)] = f"open file {target}: {cmdline[:120]}"
                    break
        except (OSError, IndexError):
            continue
    return found


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--out", default=None, help=f"JSON output file (default: $HPC_GRPO_RUN_DIR/{layout.PROBE_FILE})")
    p.add_argument("--sleep", type=float, default=0.0, help="stay this many seconds after probing")
    a = p.parse_args(argv)
    out = Path(a.out) if a.out else layout.probe_file(os.environ.get("HPC_GRPO_RUN_DIR", "."))
    result = probe()
    out.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(out, json.dumps(result, indent=2) + "\n")
    print(f"hpc-grpo probe: {result['nodes_alive']} node(s), {result['gpus_total']} GPU(s): "
          f"{sorted(n['NodeManagerAddress'] for n in result['nodes'])}", flush=True)
    if a.sleep:
        time.sleep(a.sleep)
    return 0


if __name__ == "__main__":
    sys.exit(main())
