"""The one module through which every Slurm command goes.

Why one place: every call gets a timeout (a hung slurmctld must not hang the CLI), every failure becomes one
exception type that names the command and Slurm's own message, and each command sits next to the output format
it asks for. Their output is read by hpc_grpo.cluster.slurm_output (pure parsers, with the records they return),
the meaning of job states is hpc_grpo.cluster.states, #SBATCH options are hpc_grpo.cluster.sbatch. Stdlib only:
`hpc-grpo status` must answer instantly.

Environment: clients find the cluster through SLURM_CONF when it is not the system one (the slurm-dev cluster:
`source .slurm-dev/env.sh`).
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess

from hpc_grpo.cluster.slurm_output import (
    Attempt,
    JobInfo,
    NodeShape,
    PartitionLimits,
    parse_assoc,
    parse_attempts,
    parse_config_value,
    parse_node_addrs,
    parse_node_shapes,
    parse_sacct,
    parse_sinfo,
    parse_squeue,
)
from hpc_grpo.common.slurm_time import parse_duration

__all__ = [
    "SlurmError",
    "associations",
    "available",
    "batch_script",
    "cancel",
    "cluster_name",
    "gpu_query",
    "hostnames",
    "job_attempts",
    "job_states",
    "node_addresses",
    "partition_limits",
    "partition_nodes",
    "requeue",
    "sacct_states",
    "squeue_states",
    "test_only",
    "time_left_s",
]


class SlurmError(RuntimeError):
    """A Slurm command failed, timed out or answered something we cannot use."""

    def __init__(self, cmd: list[str], message: str, returncode: int | None = None) -> None:
        self.cmd = list(cmd)
        self.stderr = message
        self.returncode = returncode
        rc = "" if returncode is None else f" (exit {returncode})"
        super().__init__(f"`{' '.join(cmd)}` failed{rc}: {message.strip() or 'no error message'}")


_JOB_ID = re.compile(r"^\d+(?:[_+]\d+)?$")
# ArrayJobID and ArrayTaskID last: an array task goes by ARRAY_TASK (JobID is its own number), as sacct names it
_SQUEUE_FORMAT = "JobID:|,State:|,TimeUsed:|,exit_code:|,NodeList:|,Reason:|,ArrayJobID:|,ArrayTaskID:|"
_SACCT_FIELDS = "JobID,State,Elapsed,ExitCode,NodeList,Reason"
_SINFO_FORMAT = "%P|%D|%c|%G|%m|%l"
_ATTEMPT_FIELDS = "JobID,State,Elapsed,ExitCode,NodeList,Reason,Start,End"
_NODES_FORMAT = "%N|%c|%G|%m"


# ------------------------------------------------------------------------------------------------------ running


def _run(args: list[str], timeout: float = 20) -> str:
    """Run one Slurm command and return its stdout; raise SlurmError on a non-zero exit, a timeout or no binary.

    Every Slurm call goes through here so that none can hang (sinfo blocks for seconds while slurmctld is down)
    and every error message carries the command and Slurm's stderr.
    """
    return _run_full(args, timeout)[0]


def _run_full(args: list[str], timeout: float = 20, stdin_text: str | None = None) -> tuple[str, str]:
    """_run that also returns stderr, for commands that report errors with exit status 0 (scontrol write)."""
    try:
        proc = subprocess.run(
            args, capture_output=True, text=True, timeout=timeout, check=False,
            **({"input": stdin_text} if stdin_text is not None else {"stdin": subprocess.DEVNULL}),
        )
    except FileNotFoundError as e:
        raise SlurmError(args, f"{args[0]} not found on PATH (is Slurm installed here?)") from e
    except PermissionError as e:  # a PATH folder this user cannot search, or a file by that name it cannot run
        raise SlurmError(args, f"{args[0]} cannot be run by this user ({e.strerror}): check PATH and its "
                         "permissions") from e
    except subprocess.TimeoutExpired as e:
        raise SlurmError(args, f"timed out after {timeout:g}s (slurmctld down or overloaded?)") from e
    if proc.returncode != 0:
        raise SlurmError(args, proc.stderr or proc.stdout, proc.returncode)
    return proc.stdout, proc.stderr


def _run_or_none(args: list[str], none_when: str, timeout: float = 20) -> str | None:
    """_run, but None when Slurm's error says there is nothing to report (`none_when`, case-insensitive)."""
    try:
        return _run(args, timeout=timeout)
    except SlurmError as e:
        if none_when in e.stderr.lower():
            return None
        raise


def _check_ids(job_ids: list[str]) -> list[str]:
    out: list[str] = []
    for j in job_ids:
        j = str(j).strip()
        if not _JOB_ID.match(j):
            raise ValueError(f"not a Slurm job id: {j!r} (expected digits, optionally _N or +N)")
        if j not in out:
            out.append(j)
    return out


# ------------------------------------------------------------------------------------------------------ queries


def available() -> bool:
    """True when Slurm clients are installed and a controller answers (decides local vs Slurm, skips tests)."""
    if shutil.which("sinfo") is None:
        return False
    try:
        _run(["sinfo", "--noheader", "-o", "%P"], timeout=10)
    except SlurmError:
        return False
    return True


def partition_limits(partition: str | None) -> PartitionLimits:
    """Nodes, CPUs, GPUs, memory and time limit of a partition (None: the default one), to check a plan against."""
    args = ["sinfo", "--noheader", "-o", _SINFO_FORMAT]
    if partition:
        args += ["-p", partition]
    text = _run(args)
    try:
        return parse_sinfo(text, partition)
    except LookupError as e:
        raise SlurmError(args, f"{e}; `sinfo -s` lists the partitions") from e


def squeue_states(job_ids: list[str]) -> dict[str, JobInfo]:
    """States of the jobs slurmctld still remembers (live ones, and finished ones for MinJobAge seconds).

    squeue exits non-zero with "Invalid job id specified" when it knows none of the ids: that is an empty answer.
    """
    ids = _check_ids(job_ids)
    if not ids:
        return {}
    text = _run_or_none(["squeue", "--noheader", "--states=all", "-j", ",".join(ids), "-O", _SQUEUE_FORMAT],
                        none_when="invalid job id")
    return parse_squeue(text) if text is not None else {}


def sacct_states(job_ids: list[str]) -> dict[str, JobInfo]:
    """States from accounting (-X: allocations, not steps), for jobs squeue has already forgotten.

    Returns {} when accounting is disabled on the cluster (then an old job's state is unknowable).
    """
    ids = _check_ids(job_ids)
    if not ids:
        return {}
    text = _run_or_none(["sacct", "--parsable2", "--noheader", "-X", "-j", ",".join(ids), "-o", _SACCT_FIELDS],
                        none_when="accounting storage is disabled", timeout=30)
    return parse_sacct(text) if text is not None else {}


def job_states(job_ids: list[str]) -> dict[str, JobInfo]:
    """State of each job: squeue first (current truth), then sacct for the ids squeue no longer knows.

    Keys are job ids as Slurm prints them; an id that neither knows is absent from the result.
    """
    ids = _check_ids(job_ids)
    found = squeue_states(ids)
    missing = [j for j in ids if j not in found]
    if missing:
        for jid, info in sacct_states(missing).items():
            found.setdefault(jid, info)
    return found


def job_attempts(job_ids: list[str]) -> dict[str, list[Attempt]]:
    """Every allocation of each job (requeues, preemptions, time limits), oldest first; {} without accounting."""
    ids = _check_ids(job_ids)
    if not ids:
        return {}
    text = _run_or_none(["sacct", "--parsable2", "--noheader", "-X", "-D", "-j", ",".join(ids), "-o", _ATTEMPT_FIELDS],
                        none_when="accounting storage is disabled", timeout=30)
    return parse_attempts(text) if text is not None else {}


def batch_script(job_id: str) -> str:
    """The batch script slurmctld holds for a job (what really ran, for `status` and debugging).

    scontrol exits 0 even for an unknown job, printing only to stderr: an empty script is an error.
    """
    (jid,) = _check_ids([job_id])
    args = ["scontrol", "write", "batch_script", jid, "-"]
    out, err = _run_full(args)
    if not out:
        raise SlurmError(args, err or f"no batch script for job {jid} (finished more than MinJobAge ago?)")
    return out


def requeue(job_id: str) -> None:
    """`scontrol requeue`: Slurm sends SIGTERM (no save hook runs) and queues the job again under its id."""
    (jid,) = _check_ids([job_id])
    _run(["scontrol", "requeue", jid])


def cancel(job_id: str, signal: str | None = None) -> None:
    """Cancel a job, or with `signal` (e.g. "USR2": submitit's checkpoint-and-requeue) only signal its steps.

    Cancelling a job that already ended is not an error (scancel exits 0).
    """
    (jid,) = _check_ids([job_id])
    args = ["scancel"]
    if signal:
        if not re.fullmatch(r"(SIG)?[A-Z0-9]+", signal):
            raise ValueError(f"not a signal name: {signal!r}")
        args.append(f"--signal={signal}")
    args.append(jid)
    _run(args)


# ------------------------------------------------------------------------------------------------------ preflight


def partition_nodes(partition: str | None) -> list[NodeShape]:
    """Every node of a partition (None: the default one) with its CPUs, GPUs (GRES) and memory."""
    name = partition or partition_limits(None).name
    args = ["sinfo", "-N", "--noheader", "-p", name, "-o", _NODES_FORMAT]
    return parse_node_shapes(_run(args))


def cluster_name() -> str | None:
    """The ClusterName of the Slurm this machine's clients talk to (SLURM_CONF or the system one); None if none.

    Asked once per process and SLURM_CONF value: cluster choice and plan's preflight both want it.
    """
    return _cluster_name(os.environ.get("SLURM_CONF", ""))


@functools.lru_cache(maxsize=4)
def _cluster_name(_conf: str) -> str | None:
    if shutil.which("scontrol") is None:
        return None
    try:
        return parse_config_value(_run(["scontrol", "show", "config"], timeout=10), "ClusterName")
    except SlurmError:
        return None


def associations(user: str, cluster: str | None = None) -> list[tuple[str, list[str]]] | None:
    """The accounts and QOS the user may submit with; None when accounting cannot be asked (no slurmdbd)."""
    if not re.fullmatch(r"[A-Za-z0-9._-]+", user):
        raise ValueError(f"not a user name: {user!r}")
    args = ["sacctmgr", "--noheader", "--parsable2", "show", "assoc", "where", f"user={user}"]
    if cluster:
        args.append(f"cluster={cluster}")
    args.append("format=Account,QOS")
    try:
        return parse_assoc(_run(args, timeout=20))
    except SlurmError:
        return None


def test_only(script: str) -> str:
    """`sbatch --test-only` on a batch script: Slurm's own answer whether and where it could start. Queues nothing.

    Returns sbatch's message ("Job 12 to start at ... on nodes node1"); raises SlurmError with Slurm's reason
    ("Requested node configuration is not available") for a request no node can ever satisfy.
    """
    out, err = _run_full(["sbatch", "--test-only"], timeout=30, stdin_text=script)
    return (err or out).strip()


def gpu_query(job_id: str, fields: str, nodes: int, timeout: float = 60) -> str:
    """`nvidia-smi --query-gpu=FIELDS --format=csv,noheader,nounits` on every node of a running job.

    One task per node through `srun --overlap --jobid`: it shares the job's allocation (no new resources, no
    queueing) and sees the job's GPUs. Each output line is prefixed with the Slurm node name.
    """
    (jid,) = _check_ids([job_id])
    if not re.fullmatch(r"[a-z_.,]+", fields):
        raise ValueError(f"not nvidia-smi query fields: {fields!r}")
    cmd = f"nvidia-smi --query-gpu={fields} --format=csv,noheader,nounits | sed \"s/^/$SLURMD_NODENAME, /\""
    args = ["srun", "--overlap", f"--jobid={jid}", f"--nodes={int(nodes)}", f"--ntasks={int(nodes)}",
            "--ntasks-per-node=1", "bash", "-c", cmd]
    return _run(args, timeout=timeout)


def time_left_s(job_id: str) -> int | None:
    """Seconds left in a running job's allocation (squeue's TimeLeft); None when unknown or unlimited.

    Tells a time-limit warning (little time left) from a preemption or a user's signal (much time left).
    """
    (jid,) = _check_ids([job_id])
    text = _run_or_none(["squeue", "--noheader", "-j", jid, "-O", "TimeLeft:|"], none_when="invalid job id", timeout=10)
    if text is None:
        return None
    first = next((ln for ln in text.splitlines() if ln.strip()), "")
    try:
        return parse_duration(first.split("|")[0])
    except ValueError:
        return None


# ------------------------------------------------------------------------------------------------------ in the job


def hostnames(nodelist: str) -> list[str]:
    """The node names of a hostlist expression (a job's SLURM_JOB_NODELIST, "node[1-4]"), in Slurm's order."""
    return _run(["scontrol", "show", "hostnames", nodelist], timeout=30).split()


def node_addresses(names: list[str]) -> dict[str, str]:
    """Each node's NodeAddr (what the node's daemons, and so the job's Ray, are reached at), in one scontrol call.

    Not the host name's DNS answer: slurm-dev's nodes are all `localhost` with addresses 127.0.0.11-14, and a real
    cluster may route Ray over an address the name does not resolve to.
    """
    if not names:
        return {}
    return parse_node_addrs(_run(["scontrol", "-o", "show", "node", ",".join(names)], timeout=30))
