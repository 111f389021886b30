"""What a job asks Slurm for: its #SBATCH options, its srun options, its requeue mode and the dependency strings
that chain jobs. `request` reads the spec (the recipe's resources, else the profile's); the rest takes names and
numbers and returns plain values, which hpc_grpo.launch.render quotes into templates/sbatch.sh.j2, refusing a
value an #SBATCH line cannot hold (a line break).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hpc_grpo.config.spec import RunSpec

# Dependency kinds (sbatch --dependency=KIND:JOB). afterany: start once the job has ended, however it ended.
# afternotok: start only if it did not end COMPLETED (TIMEOUT, PREEMPTED, NODE_FAIL, FAILED, CANCELLED...).
AFTER_ANY = "afterany"
AFTER_NOT_OK = "afternotok"


@dataclass(frozen=True, slots=True)
class Request:
    """One job's allocation in Slurm's terms."""

    job_name: str
    nodes: int
    gpus_per_node: int
    gpu_type: str | None
    gpu_request: str  # how the cluster wants GPUs asked for: "gpus-per-node" or "gres"
    cpus_per_task: int
    mem_gb: int | None
    time_min: int
    partition: str | None
    account: str | None
    qos: str | None
    signal_delay_s: int  # USR2 this long before the time limit


def request(spec: RunSpec) -> Request:
    """What the run's job asks Slurm for: the recipe's resources, else the cluster profile's."""
    r, c = spec.recipe, spec.cluster
    res = r.resources
    return Request(job_name=spec.run_name, nodes=res.nodes, gpus_per_node=spec.gpus_per_node, gpu_type=c.gpu_type,
                   gpu_request=c.gpu_request, cpus_per_task=spec.cpus_per_task, mem_gb=res.mem_gb,
                   time_min=res.time_min, partition=res.partition or c.partition, account=res.account or c.account,
                   qos=res.qos or c.qos, signal_delay_s=c.signal_delay_s)


def dependency(kind: str, job_id: str) -> str:
    """The --dependency value that makes a job wait for `job_id`: "afterany:123"."""
    return f"{kind}:{job_id}"


def follow_on(after: str) -> list[tuple[str, Any]]:
    """Chained mode's follow-on options: start only if job `after` does not end well (afternotok), and be removed
    when it completes (`--kill-on-invalid-dep`), so the follow-on never waits forever."""
    return [("dependency", dependency(AFTER_NOT_OK, after)), ("kill-on-invalid-dep", "yes")]


def array(indices: list[int], parallel: int) -> str:
    """A job array's --array value: its task indices and how many run at once ("0,1,2,3%2", "0-3%2")."""
    ordered = sorted(set(indices))
    if ordered == list(range(ordered[0], ordered[-1] + 1)) and len(ordered) > 1:
        spec = f"{ordered[0]}-{ordered[-1]}"
    else:
        spec = ",".join(map(str, ordered))
    return f"{spec}%{max(1, min(parallel, len(ordered)))}"


def options(req: Request, logs: tuple[str, str], extra: list[tuple[str, Any]] | None = None) -> list[tuple[str, Any]]:
    """The #SBATCH options, in the order the batch script lists them. `logs`: the job's stdout and stderr patterns
    (in the run's submitit folder: hpc_grpo.runstate.layout); `extra`: more options (the evaluation job's afterany
    dependency, a chained follow-on's afternotok)."""
    gpus = req.gpus_per_node
    sbatch: list[tuple[str, Any]] = [
        ("job-name", req.job_name),
        ("nodes", req.nodes),
        ("ntasks-per-node", 1),
    ]
    if gpus:
        if req.gpu_request == "gres":
            sbatch.append(("gres", f"gpu:{req.gpu_type}:{gpus}" if req.gpu_type else f"gpu:{gpus}"))
        else:
            sbatch.append(("gpus-per-node", f"{req.gpu_type}:{gpus}" if req.gpu_type else gpus))
    sbatch.append(("cpus-per-task", req.cpus_per_task))
    if req.mem_gb:
        sbatch.append(("mem", f"{req.mem_gb}G"))
    sbatch.append(("time", req.time_min))
    for key, value in (("partition", req.partition), ("account", req.account), ("qos", req.qos)):
        if value:
            sbatch.append((key, value))
    sbatch += [
        ("signal", f"USR2@{req.signal_delay_s}"),
        *(extra or []),
        ("output", logs[0]),
        ("error", logs[1]),
        ("open-mode", "append"),
    ]
    return sbatch


def srun_args(logs: tuple[str, str], container: str | None, mounts: str = "",
              launcher: str | None = None) -> list[str]:
    """The options of the srun line that starts one task per node: `logs`, the stdout and stderr patterns of each
    task; in a container (pyxis), the image and `mounts` (hpc_grpo.config.mounts.mounts_option), or, with a
    `launcher`, the launcher given those options, `--` and then the task's command.

    In a container a task that stops ends the whole step (--kill-on-bad-exit): the task asks for its requeue and
    exits, and the batch script, outside the container, can only ask Slurm once every task has ended."""
    srun = ["--unbuffered", "--output", logs[0], "--error", logs[1]]
    if container:
        pyxis = [f"--container-image={container}", f"--container-mounts={mounts}", "--no-container-mount-home"]
        srun.append("--kill-on-bad-exit=1")
        srun += [launcher, *pyxis, "--"] if launcher else pyxis
    return srun


def requeue_mode(requeue: bool, chained: bool) -> dict[str, bool]:
    """--requeue or --no-requeue. Chained mode: never requeued (the site may forbid it; a preempted job must end
    PREEMPTED so its follow-on runs)."""
    return {"requeue": requeue and not chained, "no_requeue": chained}
