"""Submission through submitit: executors from a cluster profile, and the job callable.

The batch script Slurm receives is hpc-grpo's own Jinja template: our SlurmExecutor renders
submitit's submission file from it, and the same text is saved as scripts/sbatch.sh, so what
`hpc-grpo render` shows is what runs. The callable implements `checkpoint()`, so submitit
requeues it on timeout or preemption; resume itself comes from the checkpoints on disk.
"""

from __future__ import annotations

import shlex
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import submitit

from hpc_grpo import render, runs
from hpc_grpo.spec import RunSpec
from hpc_grpo.yamlio import SpecError


@dataclass(frozen=True, slots=True)
class Submission:
    run_dir: Path
    job_id: str
    executor: str
    log_hint: str
    job: Any = None
    eval: Any = None  # the evaluation job's Submission (Slurm: queued afterok the training job)


class TrainJob:
    """What each task of the job runs: the engine's launch script (Ray bootstrap for verl).

    eval_after (cluster=local, where there is no scheduler to chain a job): evaluate once training succeeded.
    """

    def __init__(self, run_dir: str, eval_after: bool = False) -> None:
        self.run_dir = run_dir
        self.eval_after = eval_after

    def __call__(self) -> int:
        script = Path(self.run_dir) / "scripts" / "launch.sh"
        proc = subprocess.run(["bash", str(script)], cwd=self.run_dir, check=False)
        if proc.returncode != 0:
            raise RuntimeError(f"{script} exited with status {proc.returncode}; see the job's logs in {self.run_dir}")
        if getattr(self, "eval_after", False):
            from hpc_grpo.evaluate import EvalJob, job_argv

            EvalJob(job_argv(Path(self.run_dir)))()
        return proc.returncode

    def checkpoint(self, *args: Any, **kwargs: Any) -> submitit.helpers.DelayedSubmission:
        """Called by submitit on timeout/preemption (global rank 0): record it, requeue the same callable.

        The engine saves periodically and resumes from the newest complete checkpoint on disk, so the
        requeued job continues; nothing in memory is relied on.
        """
        env = submitit.JobEnvironment()
        runs.append_history(Path(self.run_dir), env.job_id, "requeue", "slurm", note="timeout or preemption")
        return submitit.helpers.DelayedSubmission(TrainJob(self.run_dir, getattr(self, "eval_after", False)))


class TemplateSlurmExecutor(submitit.SlurmExecutor):
    """submitit's SlurmExecutor, with the batch script rendered from templates/sbatch.sh.j2."""

    def __init__(self, spec: RunSpec, dependency: str | None = None) -> None:
        # python: the frozen interpreter, so the srun line runs the same one as every other in-job step.
        super().__init__(folder=render.submitit_dir(spec), max_num_timeout=20, python=shlex.quote(spec.python))
        self.spec = spec
        self.dependency = dependency
        self.last_script = ""

    def _make_submission_file_text(self, command: str, uid: str) -> str:
        self.last_script = render.render_sbatch(self.spec, command, self.dependency)
        return self.last_script


def slurm_parameters(spec: RunSpec) -> dict[str, Any]:
    """The same numbers the template uses, so submitit's own bookkeeping (task count) agrees."""
    r, c = spec.recipe, spec.cluster
    params: dict[str, Any] = {
        "job_name": spec.run_name,
        "nodes": r.resources.nodes,
        "ntasks_per_node": 1,
        "cpus_per_task": r.resources.cpus_per_task or c.cpus_per_node,
        "time": r.resources.time_min,
        "signal_delay_s": c.signal_delay_s,
    }
    if spec.gpus_per_node:
        params["gpus_per_node"] = spec.gpus_per_node
    return params


def check_partition(spec: RunSpec) -> None:
    """Ask Slurm what the partition really has: a request it can never satisfy is refused now, not left pending."""
    from hpc_grpo import slurm

    r, c = spec.recipe, spec.cluster
    partition = r.resources.partition or c.partition
    limits = slurm.partition_limits(partition)
    where = f"partition {limits.name}"
    if r.resources.nodes > limits.nodes:
        raise SpecError(f"{r.resources.nodes} nodes asked; {where} has {limits.nodes}", key="resources.nodes")
    if spec.gpus_per_node > limits.gpus_per_node:
        raise SpecError(f"{spec.gpus_per_node} GPUs per node asked; {where} nodes have {limits.gpus_per_node}",
                        key="resources.gpus_per_node")
    cpus = r.resources.cpus_per_task or c.cpus_per_node
    if cpus > limits.cpus_per_node:
        raise SpecError(f"{cpus} CPUs per task asked; {where} nodes have {limits.cpus_per_node}",
                        key="resources.cpus_per_task")
    if limits.max_time_min is not None and r.resources.time_min > limits.max_time_min:
        raise SpecError(f"time {r.resources.time} asked; {where} allows {limits.max_time_min} minutes",
                        key="resources.time")


def write_run(spec: RunSpec, files: dict[str, str]) -> None:
    render.write_files(spec.path, files)
    (spec.path / "checkpoints").mkdir(exist_ok=True)


def submit_run(spec: RunSpec, files: dict[str, str], purpose: str = "train", note: str = "",
               data: dict[str, Any] | None = None) -> Submission:
    """Create the run directory, write the frozen spec and scripts, submit, record the job id (with a note and
    details, e.g. what `hpc-grpo resume` resumes from)."""
    if spec.cluster.scheduler == "slurm":
        check_partition(spec)
    with runs.submit_lock(spec.path):
        runs.refuse_if_live(spec.path)
        write_run(spec, files)
        if spec.cluster.scheduler == "slurm":
            return _submit_slurm(spec, purpose, note, data)
        return _submit_local(spec, purpose, note, data)


def _submit_slurm(spec: RunSpec, purpose: str, note: str = "", data: dict[str, Any] | None = None) -> Submission:
    executor = TemplateSlurmExecutor(spec)
    executor.update_parameters(**slurm_parameters(spec))
    job = executor.submit(TrainJob(spec.run_dir))
    # Same text Slurm received; equal to the rendered one.
    (spec.path / "scripts" / "sbatch.sh").write_text(executor.last_script)
    runs.append_history(spec.path, job.job_id, purpose, "slurm", note=note, data=data)
    log = render.submitit_dir(spec) / f"{job.job_id}_0_log.out"
    eval_job = None
    if spec.recipe.eval.enabled:
        from hpc_grpo.evaluate import job_argv, submit_eval

        eval_job = submit_eval(spec, job_argv(spec.path), after=job.job_id)
    return Submission(spec.path, job.job_id, "slurm", str(log), job, eval_job)


def _submit_local(spec: RunSpec, purpose: str, note: str = "", data: dict[str, Any] | None = None) -> Submission:
    executor = submitit.LocalExecutor(folder=render.submitit_dir(spec), python=shlex.quote(spec.python))
    executor.update_parameters(timeout_min=spec.recipe.resources.time_min, nodes=1, tasks_per_node=1,
                               gpus_per_node=spec.gpus_per_node)
    job = executor.submit(TrainJob(spec.run_dir, eval_after=spec.recipe.eval.enabled))
    runs.append_history(spec.path, job.job_id, purpose, "local", note=note, data=data)
    log = render.submitit_dir(spec) / f"{job.job_id}_0_log.out"
    return Submission(spec.path, job.job_id, "local", str(log), job)

