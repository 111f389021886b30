"""Wait until every node of the job has joined the Ray cluster, or fail naming the missing ones.

verl's example sleeps a fixed 10 + 5 x (N - 1) s and hopes; a slow node then surfaces minutes
later as "Total available GPUs 8 is less than desired 16". Polling with a deadline is both
faster on a healthy cluster and clear on a broken one.
"""

from __future__ import annotations

import argparse
import os
import sys
import time


def _alive(nodes: list[dict]) -> list[dict]:
    return [n for n in nodes if n.get("Alive") or n.get("alive")]


def wait_for_nodes(address: str, nodes: int, gpus: int, timeout: float, expect: list[str],
                   ray_pid: int | None = None) -> int:
    import ray

    deadline = time.monotonic() + timeout
    connected = False
    while not connected:
        if ray_pid is not None and not _pid_alive(ray_pid):
            print("hpc-grpo: the Ray head process died before the cluster formed", file=sys.stderr)
            return 1
        try:
            ray.init(address=address, logging_level="ERROR", log_to_driver=False)
            connected = True
        except (ConnectionError, RuntimeError, TimeoutError) as exc:
            if time.monotonic() > deadline:
                print(f"hpc-grpo: cannot reach the Ray head at {address}: {exc}", file=sys.stderr)
                return 1
            time.sleep(0.2)
    try:
        while True:
            alive = _alive(ray.nodes())
            have_gpus = sum(int(n.get("Resources", {}).get("GPU", 0)) for n in alive)
            if len(alive) >= nodes and have_gpus >= gpus:
                print(f"hpc-grpo: {len(alive)} node(s), {have_gpus} GPU(s) in the Ray cluster")
                return 0
            if time.monotonic() > deadline:
                joined = {n.get("NodeManagerAddress") for n in alive}
                print(f"hpc-grpo: after {timeout:.0f}s only {len(alive)} of {nodes} nodes ({have_gpus} of {gpus} GPUs) "
                      f"joined; joined addresses: {sorted(joined)}; expected nodes: {expect}", file=sys.stderr)
                return 1
            time.sleep(0.25)
    finally:
        ray.shutdown()


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    return True


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--address", required=True)
    p.add_argument("--nodes", type=int, required=True)
    p.add_argument("--gpus", type=int, default=0)
    p.add_argument("--timeout", type=float, default=180)
    p.add_argument("--expect", nargs="*", default=[])
    p.add_argument("--ray-pid", type=int, default=None)
    a = p.parse_args(argv)
    return wait_for_nodes(a.address, a.nodes, a.gpus, a.timeout, a.expect, a.ray_pid)


if __name__ == "__main__":
    sys.exit(main())
