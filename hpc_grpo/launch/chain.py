"""Chained mode (cluster.restart=chain), for clusters where users may not requeue: each job queues its own
follow-on with `--dependency=afternotok:<this job>`; the follow-on asks Slurm how its predecessor ended and goes
on only after TIMEOUT, PREEMPTED or NODE_FAIL (time limits counted against resources.max_timeout_requeues, as in
requeue mode). Any other end (FAILED, CANCELLED, OUT_OF_MEMORY) stops the chain at once, and the history says so.
A predecessor that COMPLETED never starts its follow-on: `--kill-on-invalid-dep` removes it.

Called by the job callable (hpc_grpo.launch.submit.TrainJob) at the start of every chained job, which also hands
in how to queue the follow-on (submit.submit_follow_on): the decisions here need no submitit.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from hpc_grpo.runstate import restart, runs
from hpc_grpo.cluster import sbatch, slurm
from hpc_grpo.config.spec import RunSpec


def predecessor_state(job_id: str) -> str | None:
    info = slurm.job_states([job_id]).get(job_id)
    return info.state if info else None


def start(spec: RunSpec, job_id: str, rank: int, after: str | None,
          queue_follow_on: Callable[[RunSpec, str], str]) -> bool:
    """At the start of every chained job (every task; rank 0 writes): True to train, False to exit now.

    The follow-on is queued first thing (`queue_follow_on(spec, job_id)` returns its job id), so a job killed at any
    moment afterwards still has one.
    """
    run_dir = Path(spec.run_dir)
    if after:
        state = predecessor_state(after)
        decision = restart.chained_start(state, restart.timeouts_so_far(runs.read_history(run_dir)),
                                         spec.recipe.resources.max_timeout_requeues)
        if not decision.requeue:
            if rank == 0:
                runs.append_history(run_dir, job_id, "failed", "slurm", note=f"{decision.reason} (job {after})")
            print(f"hpc-grpo: chained job {job_id}: {decision.reason} (job {after})", flush=True)
            return False
        if rank == 0:
            runs.append_history(run_dir, job_id, "requeue", "slurm",
                                note=f"{decision.reason}; chained after job {after}, which ended {state}")
    if rank == 0:
        follow = queue_follow_on(spec, job_id)
        runs.append_history(run_dir, follow, "chain", "slurm", note=f"follow-on of job {job_id} ({sbatch.AFTER_NOT_OK})")
        print(f"hpc-grpo: chained mode: queued follow-on job {follow} ({sbatch.dependency(sbatch.AFTER_NOT_OK, job_id)})",
              flush=True)
    return True
