"""`ray start` with the job's interpreter; for a worker node begun before the head is up: import Ray's CLI, then wait
for the head's GCS port.

Importing Ray's CLI costs a few seconds of CPU (far more on a cold shared filesystem). Waiting for the head in bash
and only then running `ray start` puts that import on the critical path after the head's own start-up; here it runs
while the head starts. Once the GCS port accepts connections this process *becomes* `ray start` (same process,
same signal handling: SIGTERM stops this node's Ray processes, as it would for the `ray` command).

  $python -m hpc_grpo.job.ray_start --wait HOST:PORT --timeout S [--done-file F] -- <ray start arguments>   (worker)
  $python -m hpc_grpo.job.ray_start -- --head <ray start arguments>                                            (head)

Running Ray's CLI through this module (not the `ray` script from PATH) keeps Ray on the interpreter the job was
rendered for: Ray starts its agents and workers with the interpreter its CLI runs on.

Exit status 3: the head's port did not open within the timeout; 4: the done file appeared first (node 0 ended).
"""

from __future__ import annotations

import argparse
import socket
import sys
import time
from pathlib import Path


def _log(message: str) -> None:
    print(f"hpc-grpo: [{time.time():.3f}] {message}", flush=True)


def port_open(address: str) -> bool:
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=0.5):
            return True
    except OSError:
        return False


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--" not in argv:
        print("usage: python -m hpc_grpo.job.ray_start [--wait HOST:PORT --timeout S [--done-file F]] -- ARGS...",
              file=sys.stderr)
        return 2
    split = argv.index("--")
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--wait", default=None, help="the head's GCS address (omit on the head itself)")
    p.add_argument("--timeout", type=float, default=0.0)
    p.add_argument("--done-file", default=None, help="give up when this file appears (node 0 has finished)")
    p.add_argument("--label", default="", help="prefix for log lines (the node's name)")
    a = p.parse_args(argv[:split])
    ray_args = argv[split + 1:]

    from ray.scripts.scripts import main as ray_main  # the slow part, overlapped with the head's start-up

    prefix = f"{a.label}: " if a.label else ""
    deadline = time.monotonic() + a.timeout
    done = Path(a.done_file) if a.done_file else None
    while a.wait is not None and not port_open(a.wait):
        if done is not None and done.exists():
            _log(f"{prefix}node 0 finished before its Ray head was reachable")
            return 4
        if time.monotonic() > deadline:
            _log(f"{prefix}Ray head {a.wait} not reachable after {a.timeout:.0f}s")
            return 3
        time.sleep(0.05)
    if a.wait is not None:
        _log(f"{prefix}Ray head {a.wait} is up; starting this node's Ray")
    sys.argv = ["ray", "start", *ray_args]
    result = ray_main()
    return result if isinstance(result, int) else 0


if __name__ == "__main__":
    sys.exit(main())
