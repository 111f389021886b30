"""Who and where this job task is: job id, attempt, node index, the job's nodes and their addresses.

The one place in-job code reads the scheduler's environment (SLURM_*, submitit's local job id); the Slurm commands
themselves go through hpc_grpo.cluster.slurm. A local job (cluster=local, submitit's LocalExecutor) is one node whose
address comes from the cluster profile (a loopback address other than 127.0.0.1, see Cluster.local_address).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass


class JobEnvError(RuntimeError):
    """The job's environment does not say what this task needs (a variable missing, Slurm not answering)."""


@dataclass(frozen=True, slots=True)
class NodeLayout:
    """This task's place in the job: the nodes in Slurm's order (index 0 hosts the Ray head) and their addresses."""

    job_id: str
    executor: str  # "slurm" or "local"
    attempt: int  # Slurm's restart count: a requeued job keeps its id
    index: int
    names: tuple[str, ...]
    addresses: tuple[str, ...]
    address: str  # this node's (Slurm: SLURMD_NODENAME's NodeAddr)

    @property
    def name(self) -> str:
        return self.names[self.index]

    @property
    def head_address(self) -> str:
        return self.addresses[0]


def job_identity(environ: Mapping[str, str] | None = None) -> tuple[str, str]:
    """(job id, executor) of the running job: Slurm's, submitit's local one, or this process. An array task (a
    sweep's member) is ARRAY_TASK, the id its run's history, squeue and sacct know it by (SLURM_JOB_ID is its own
    number)."""
    env = os.environ if environ is None else environ
    if env.get("SLURM_ARRAY_JOB_ID") and env.get("SLURM_ARRAY_TASK_ID"):
        return f"{env['SLURM_ARRAY_JOB_ID']}_{env['SLURM_ARRAY_TASK_ID']}", "slurm"
    if env.get("SLURM_JOB_ID"):
        return env["SLURM_JOB_ID"], "slurm"
    local = env.get("SUBMITIT_LOCAL_JOB_ID")
    return (local, "local") if local else (str(os.getpid()), "local")


def restart_count(environ: Mapping[str, str] | None = None) -> int:
    """How often Slurm has requeued this job (0 outside Slurm)."""
    value = (os.environ if environ is None else environ).get("SLURM_RESTART_COUNT", "")
    return int(value) if value.isdigit() else 0


def _need(environ: Mapping[str, str], key: str) -> str:
    value = environ.get(key, "")
    if not value:
        raise JobEnvError(f"{key} is not set: this task does not run inside a Slurm job step")
    return value


def slurm_layout(environ: Mapping[str, str], nodes: int) -> NodeLayout:
    """The layout from Slurm: node names from SLURM_JOB_NODELIST, addresses from each node's NodeAddr (never
    127.0.0.1, never a DNS answer), this task's node from SLURMD_NODENAME and SLURM_NODEID."""
    from hpc_grpo.cluster import slurm

    job_id = _need(environ, "SLURM_JOB_ID")
    index = int(_need(environ, "SLURM_NODEID"))
    me = _need(environ, "SLURMD_NODENAME")
    try:
        names = slurm.hostnames(_need(environ, "SLURM_JOB_NODELIST"))
        addrs = slurm.node_addresses(names if me in names else [*names, me])
    except slurm.SlurmError as exc:
        raise JobEnvError(str(exc)) from exc
    if len(names) != nodes:
        raise JobEnvError(f"expected {nodes} nodes, Slurm gave {len(names)}: {' '.join(names)}")
    missing = [n for n in [*names, me] if not addrs.get(n)]
    if missing:
        raise JobEnvError(f"scontrol gave no NodeAddr for {', '.join(missing)}")
    return NodeLayout(job_id, "slurm", restart_count(environ), index, tuple(names), tuple(addrs[n] for n in names),
                      addrs[me])


def local_layout(environ: Mapping[str, str], address: str) -> NodeLayout:
    """cluster=local: one node, this machine, at `address`; the job id is submitit's (the job's pid)."""
    job_id, _ = job_identity(environ)
    return NodeLayout(job_id, "local", 0, 0, (os.uname().nodename,), (address,), address)


def node_layout(nodes: int, local_address: str | None, environ: Mapping[str, str] | None = None) -> NodeLayout:
    """Slurm's layout, or the local one when the run was rendered for cluster=local (`local_address` given)."""
    env = os.environ if environ is None else environ
    if local_address:
        if nodes != 1:
            raise JobEnvError(f"a local job runs on one node, not {nodes}")
        return local_layout(env, local_address)
    return slurm_layout(env, nodes)
