"""One reader of /proc/PID/stat for every layer: whether a process still runs (a zombie does not), its parent,
and its identity (pid + start time). hpc_grpo.job.proc_tree stops process trees with it; runstate and launch ask
whether a local job or a trainer has ended."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

ENDED_STATES = ("Z", "X")  # a zombie or a dead task: nothing runs, nothing is left to kill


@dataclass(frozen=True, slots=True)
class Stat:
    """The fields of /proc/PID/stat hpc-grpo needs."""

    state: str
    ppid: int
    start: int  # clock ticks after boot (field 22): with the pid, a process's identity


def parse_stat(text: str) -> Stat:
    """Fields of a /proc/PID/stat line; the command name (field 2) may hold spaces and parentheses."""
    rest = text.rsplit(")", 1)[1].split()
    return Stat(rest[0], int(rest[1]), int(rest[19]))


def read_stat(pid: int) -> Stat | None:
    try:
        return parse_stat(Path(f"/proc/{pid}/stat").read_text())
    except (OSError, IndexError, ValueError):
        return None


def ended(pid: int) -> bool:
    """Gone, or a zombie its parent has not reaped yet (os.kill(pid, 0) still succeeds on one)."""
    st = read_stat(pid)
    return st is None or st.state in ENDED_STATES
