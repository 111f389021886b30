"""Stop one process and everything below it, and nothing else: PIDs checked against their start time.

Why not `ray stop`: it kills every Ray process on the host, other jobs' included. `ray start --block` stops the
processes it started itself when it gets SIGTERM, but Ray's agents are the raylet's children: when the raylet goes
without stopping them (on a worker whose head left first, measured with Ray 2.60) they stay for minutes and ignore
SIGTERM. So the tree is recorded before the SIGTERM, and what is left of it after a grace time gets SIGKILL: only
those PIDs, and only while each PID is still the same process (same start time), never a reused PID.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from hpc_grpo.common.procstat import ENDED_STATES, Stat, parse_stat, read_stat  # noqa: F401  (Stat, parse_stat: read here by callers)


def identity(pid: int) -> int | None:
    """The process's start time while it runs; None once it is gone or a zombie (nothing left to kill)."""
    st = read_stat(pid)
    return None if st is None or st.state in ENDED_STATES else st.start


def process_table() -> list[tuple[int, int]]:
    """(pid, ppid) of every process visible in /proc."""
    table = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (st := read_stat(int(entry.name))) is not None:
            table.append((int(entry.name), st.ppid))
    return table


def descendants(root: int, table: Iterable[tuple[int, int]]) -> list[int]:
    """Every pid below `root` in a (pid, ppid) table, parents before their children."""
    kids: dict[int, list[int]] = {}
    for pid, ppid in table:
        kids.setdefault(ppid, []).append(pid)
    out: list[int] = []
    queue = [root]
    while queue:
        for child in sorted(kids.get(queue.pop(0), [])):
            if child not in out and child != root:
                out.append(child)
                queue.append(child)
    return out


def snapshot(root: int) -> dict[int, int]:
    """pid -> start time of every live process below `root`, now."""
    return {pid: start for pid in descendants(root, process_table()) if (start := identity(pid)) is not None}


def still_there(tree: dict[int, int], probe: Callable[[int], int | None] = identity) -> list[int]:
    """The pids of `tree` that are still the same processes (same start time)."""
    return [pid for pid, start in tree.items() if probe(pid) == start]


def stop_tree(proc: subprocess.Popen, grace_s: float = 3.0, log: Callable[[str], None] = print) -> None:
    """SIGTERM `proc` (our own child), wait for it, then SIGKILL what is left of its tree after `grace_s`."""
    if proc.poll() is not None:
        return
    tree = snapshot(proc.pid)
    proc.terminate()
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        log(f"process {proc.pid} did not stop on SIGTERM in 60s: killing it")
        proc.kill()
        proc.wait()
    deadline = time.monotonic() + grace_s
    while (left := still_there(tree)) and time.monotonic() < deadline:
        time.sleep(0.2)
    if left:
        log(f"killing {len(left)} process(es) that outlived their parent: {' '.join(map(str, left))}")
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
