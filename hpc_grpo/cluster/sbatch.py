"""What a job asks Slurm for: its #SBATCH options, its srun options, its requeue mode and the dependency strings
that chain jobs. Plain values only: hpc_grpo.launch.render quotes them into templates/sbatch.sh.j2, and a value an
#SBATCH line cannot hold (a line break) is refused there. Stdlib only.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hpc_grpo.config.spec import RunSpec

# Dependency kinds (sbatch --dependency=KIND:JOB). afterany: start once the job has ended, however it ended.
# afternotok: start only if it did not end COMPLETED (TIMEOUT, PREEMPTED, NODE_FAIL, FAILED, CANCELLED...).
AFTER_ANY = "afterany"
AFTER_NOT_OK = "afternotok"


def dependency(kind: str, job_id: str) -> str:
    """The --dependency value that makes a job wait for `job_id`: "afterany:123"."""
    return f"{kind}:{job_id}"


def follow_on(after: str) -> list[tuple[str, Any]]:
    """Chained mode's follow-on options: start only if job `after` does not end well (afternotok), and be removed
    when it completes (`--kill-on-invalid-dep`), so the follow-on never waits forever."""
    return [("dependency", dependency(AFTER_NOT_OK, after)), ("kill-on-invalid-dep", "yes")]


def options(spec: RunSpec, folder: Path, extra: list[tuple[str, Any]] | None = None) -> list[tuple[str, Any]]:
    """The #SBATCH options, in the order the batch script lists them. `folder`: the run's submitit folder (the
    job's logs); `extra`: more options (the evaluation job's afterany dependency, a chained follow-on's afternotok)."""
    r, c = spec.recipe, spec.cluster
    res = r.resources
    gpus = spec.gpus_per_node
    sbatch: list[tuple[str, Any]] = [
        ("job-name", spec.run_name),
        ("nodes", res.nodes),
        ("ntasks-per-node", 1),
    ]
    if gpus:
        if c.gpu_request == "gres":
            sbatch.append(("gres", f"gpu:{c.gpu_type}:{gpus}" if c.gpu_type else f"gpu:{gpus}"))
        else:
            sbatch.append(("gpus-per-node", f"{c.gpu_type}:{gpus}" if c.gpu_type else gpus))
    sbatch.append(("cpus-per-task", res.cpus_per_task or c.cpus_per_node))
    if res.mem_gb:
        sbatch.append(("mem", f"{res.mem_gb}G"))
    sbatch.append(("time", res.time_min))
    for key, value in (("partition", res.partition or c.partition), ("account", res.account or c.account),
                       ("qos", res.qos or c.qos)):
        if value:
            sbatch.append((key, value))
    sbatch += [
        ("signal", f"USR2@{c.signal_delay_s}"),
        *(extra or []),
        ("output", f"{folder}/%j_0_log.out"),
        ("error", f"{folder}/%j_0_log.err"),
        ("open-mode", "append"),
    ]
    return sbatch


def srun_args(spec: RunSpec, folder: Path) -> list[str]:
    """The options of the srun line that starts one task per node: per-task logs in `folder`, the container."""
    c = spec.cluster
    srun = ["--unbuffered", "--output", f"{folder}/%j_%t_log.out", "--error", f"{folder}/%j_%t_log.err"]
    if c.setup.container:
        srun += [f"--container-image={c.setup.container}", f"--container-mounts={spec.run_dir}:{spec.run_dir}",
                 "--no-container-mount-home"]
    return srun


def requeue_mode(spec: RunSpec) -> dict[str, bool]:
    """--requeue or --no-requeue. Chained mode: never requeued (the site may forbid it; a preempted job must end
    PREEMPTED so its follow-on runs)."""
    c = spec.cluster
    chain = c.restart == "chain"
    return {"requeue": c.requeue and not chain, "no_requeue": chain}
