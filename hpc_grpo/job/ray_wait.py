"""Wait until every node of the job has joined the Ray cluster, or fail naming the missing ones.

verl's example sleeps a fixed 10 + 5 x (N - 1) s and hopes; a slow node then surfaces minutes
later as "Total available GPUs 8 is less than desired 16". Polling with a deadline is both
faster on a healthy cluster and clear on a broken one.

How it polls: first the GCS port with a plain TCP connect (ray.init() on a head that is not up
yet, or that died, blocks for tens of seconds per attempt and cannot notice the head process
dying), then GCS's node table through a bare GCS client. Not ray.init(): that would register a
driver, and a driver's arrival makes every raylet prestart Python workers, which compete for the
CPUs with the nodes still starting. ray.init() remains the fallback should the client's private
API change.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

from hpc_grpo.common.atomic import write_text_atomic
from hpc_grpo.job.ray_start import port_open

POLL_S = 0.1


def _log(message: str, err: bool = False) -> None:
    print(f"hpc-grpo: [{time.time():.3f}] {message}", file=sys.stderr if err else sys.stdout, flush=True)


def _alive(nodes: list[dict]) -> list[dict]:
    return [n for n in nodes if n.get("Alive") or n.get("alive")]


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    return True


def _gcs_lister(address: str) -> tuple[Callable[[], list[dict]], Callable[[], None]] | None:
    """ray.nodes()-shaped rows straight from GCS, or None when this Ray has no usable GcsClient."""
    try:
        # Ray's private API (not in its type information): absent or changed in a release -> the driver lister
        from ray._raylet import GcsClient  # type: ignore[attr-defined]
        from ray.core.generated.gcs_pb2 import GcsNodeInfo  # type: ignore[attr-defined]

        client = GcsClient(address=address)
    except (ImportError, AttributeError, TypeError):
        return None

    def nodes() -> list[dict]:
        info = client.get_all_node_info(timeout=5)
        return [{"Alive": n.state == GcsNodeInfo.ALIVE, "NodeManagerAddress": n.node_manager_address,
                 "Resources": dict(n.resources_total)} for n in info.values()]

    return nodes, lambda: None


def _driver_lister(address: str, deadline: float) -> tuple[Callable[[], list[dict]], Callable[[], None]] | None:
    import ray

    while True:
        try:
            ray.init(address=address, logging_level=logging.ERROR, log_to_driver=False)
            return ray.nodes, ray.shutdown
        except (ConnectionError, RuntimeError, TimeoutError) as exc:
            if time.monotonic() > deadline:
                _log(f"cannot reach the Ray head at {address}: {exc}", err=True)
                return None
            time.sleep(0.2)


def wait_for_nodes(address: str, nodes: int, gpus: int, timeout: float, expect: list[str],
                   ray_pid: int | None = None, marker: str | None = None, unit: str = "GPU(s)") -> int:
    """0 once `nodes` nodes with `gpus` of Ray's GPU resource have joined. unit: what that resource is, for the log
    line (verl's CPU mode gives Ray stand-in GPUs, one per CPU worker, on a machine with none)."""
    deadline = time.monotonic() + timeout
    import ray  # noqa: F401  # about a second on a busy node: spent while the head starts

    def head_died() -> bool:
        if ray_pid is not None and not _pid_alive(ray_pid):
            _log("the Ray head process died before every node joined (see this job's .err log)", err=True)
            return True
        return False

    while not port_open(address):
        if head_died():
            return 1
        if time.monotonic() > deadline:
            _log(f"the Ray head's GCS port {address} did not open in {timeout:.0f}s", err=True)
            return 1
        time.sleep(0.05)
    lister = _gcs_lister(address) or _driver_lister(address, deadline)
    if lister is None:
        return 1
    list_nodes, close = lister
    alive: list[dict] = []
    have_gpus = 0
    warned = False
    try:
        while True:
            try:
                alive = _alive(list_nodes())
            except Exception as exc:  # noqa: BLE001 - GCS busy or restarting: retry until the deadline
                if not warned:
                    _log(f"GCS node table not available yet ({exc}); retrying", err=True)
                    warned = True
            have_gpus = sum(int(n.get("Resources", {}).get("GPU", 0)) for n in alive)
            if len(alive) >= nodes and have_gpus >= gpus:
                now = time.time()
                _log(f"{len(alive)} node(s), {have_gpus} {unit} in the Ray cluster")
                if marker:
                    _write_marker(Path(marker), {"time": now, "nodes": len(alive), "gpus": have_gpus,
                                                 "addresses": sorted(n.get("NodeManagerAddress") for n in alive)})
                return 0
            if head_died():
                return 1
            if time.monotonic() > deadline:
                joined = {str(n.get("NodeManagerAddress")) for n in alive}
                _log(f"after {timeout:.0f}s only {len(alive)} of {nodes} nodes ({have_gpus} of {gpus} GPUs) "
                     f"joined; missing: {', '.join(missing_nodes(expect, joined)) or 'none by address'}", err=True)
                return 1
            time.sleep(POLL_S)
    finally:
        close()


def missing_nodes(expect: list[str], joined: set[str]) -> list[str]:
    """Slurm node names (from `name=address` items) whose address is not among the joined Ray nodes."""
    missing = []
    for item in expect:
        name, _, addr = item.partition("=")
        if addr not in joined:
            missing.append(f"{name} ({addr})" if addr else name)
    return missing


def _write_marker(path: Path, data: dict) -> None:
    """When every node had joined (epoch seconds), for benchmarks and post-mortems; written atomically."""
    try:
        write_text_atomic(path, json.dumps(data) + "\n")
    except OSError as exc:  # a marker must never fail the job
        _log(f"could not write {path}: {exc}", err=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--address", required=True)
    p.add_argument("--nodes", type=int, required=True)
    p.add_argument("--gpus", type=int, default=0)
    p.add_argument("--timeout", type=float, default=180)
    p.add_argument("--expect", nargs="*", default=[])
    p.add_argument("--ray-pid", type=int, default=None)
    p.add_argument("--marker", default=None, help="write {time, nodes, gpus, addresses} as JSON here once joined")
    a = p.parse_args(argv)
    return wait_for_nodes(a.address, a.nodes, a.gpus, a.timeout, a.expect, a.ray_pid, a.marker)


if __name__ == "__main__":
    sys.exit(main())
