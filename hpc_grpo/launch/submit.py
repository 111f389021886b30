"""Submission through submitit: executors from a cluster profile, the job callable, and the three submissions (the
training job, a chained follow-on, the eval job queued after training).

The batch script Slurm receives is hpc-grpo's own Jinja template: our SlurmExecutor renders
submitit's submission file from it, and the same text is saved as scripts/sbatch.sh, so what
`hpc-grpo render` shows is what runs. The callable implements `checkpoint()`, so submitit
requeues it on timeout or preemption; resume itself comes from the checkpoints on disk.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import submitit

from hpc_grpo.cluster import job_env, sbatch
from hpc_grpo.common import procstat
from hpc_grpo.evaluation import evaluate
from hpc_grpo.launch import chain, render
from hpc_grpo.runstate import layout, restart, runs, save_request
from hpc_grpo.config.resolve import load_frozen
from hpc_grpo.config.spec import RunSpec
from hpc_grpo.engines import get_engine


@dataclass(frozen=True, slots=True)
class Submission:
    run_dir: Path
    job_id: str
    executor: str
    log_hint: str
    job: Any = None
    eval: Any = None  # the evaluation job's Submission (Slurm: queued afterany the training job; checks it trained)


class _TrainingFinished(Exception):
    """Raised by checkpoint() inside submitit's USR2 handler when training ended meanwhile: __call__ returns."""


class _StopForRequeue(Exception):
    """Raised by the container's USR2 handler once the requeue is asked of the batch script: __call__ stops."""


class _NotRequeued(Exception):
    """Raised by the container's USR2 handler when the run stops here (the history says why): __call__ fails."""


# A container task's exit status after asking for its requeue (nonzero: srun --kill-on-bad-exit ends the step).
REQUEUE_EXIT = 3


class TrainJob:
    """What each task of the job runs: the engine's launch script (Ray bootstrap for verl).

    `after` is set on a chained follow-on (cluster.restart=chain): the job it waits for with afternotok.
    `eval_after` (cluster=local, where there is no scheduler to chain a job): evaluate once training ended, if the
    run is trained (also when the trainer failed after its final save: hpc_grpo.runstate.trained decides).
    """

    def __init__(self, run_dir: str, after: str | None = None, eval_after: bool = False) -> None:
        self.run_dir = run_dir
        self.after = after
        self.eval_after = eval_after
        self._proc: subprocess.Popen[bytes] | None = None
        self._attempt: str | None = None
        self._started = 0.0

    def __getstate__(self) -> dict[str, Any]:
        return {"run_dir": self.run_dir, "after": self.after, "eval_after": self.eval_after}  # never the process

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["run_dir"], state.get("after"), state.get("eval_after", False))  # type: ignore[misc]

    def __call__(self) -> int:
        run_dir = Path(self.run_dir)
        spec = load_frozen(layout.spec_file(run_dir))
        env = submitit.JobEnvironment()
        chained = spec.cluster.scheduler == "slurm" and spec.cluster.restart == "chain"
        self._attempt = f"{env.job_id}.{job_env.restart_count()}.{os.getpid()}"
        if spec.cluster.scheduler == "slurm" and spec.cluster.setup.container and not chained:
            # No `scontrol` in the image for submitit's requeue: this handler asks the batch script instead.
            signal.signal(signal.SIGUSR2, lambda signum, frame: self._container_signal())
        if chained:
            # Not submitit's checkpoint-and-requeue: ask for the save and let Slurm end the job (TIMEOUT,
            # PREEMPTED), which starts the follow-on queued below.
            signal.signal(signal.SIGUSR2, lambda signum, frame: self._request_save())
            if not chain.start(spec, env.job_id, env.global_rank, self.after, submit_follow_on):
                return 0
        script = layout.launch_script(run_dir)
        child_env = {**os.environ, save_request.ATTEMPT_ENV: self._attempt}
        self._started = time.time()
        self._proc = subprocess.Popen(["bash", str(script)], cwd=self.run_dir, env=child_env)
        try:
            # Not Popen.wait(): it holds a lock the USR2 handler (checkpoint) would then wait on forever.
            while (rc := self._proc.poll()) is None:
                time.sleep(0.2)
        except _TrainingFinished:
            return 0
        except _StopForRequeue:
            self._stop_trainer()
            print("hpc-grpo: requeue asked of the batch script (outside the container)", flush=True)
            sys.exit(REQUEUE_EXIT)
        except _NotRequeued as stop:
            self._stop_trainer()
            raise RuntimeError(f"not requeued: {stop}") from None
        if rc != 0 and self._finished():
            rc = 0  # killed by a late signal after it had written its done file: the run is trained
        if rc == save_request.STOPPED_FOR_REQUEUE and chained:
            print("hpc-grpo: saved on the signal; chained mode: waiting for Slurm to end this job, its follow-on "
                  "then resumes", flush=True)
            while True:
                time.sleep(30)
        if rc != 0:
            history = runs.read_history(run_dir)
            last = history[-1] if history else None
            said = last is not None and last.purpose == "failed" and last.job_id == str(env.job_id)
            # rc < 0: killed by a signal (scontrol requeue, scancel, a time limit): Slurm's doing, not a failure.
            if env.global_rank == 0 and rc > 0 and not said:  # the trainer may have said why just now (disk full)
                runs.append_history(run_dir, env.job_id, "failed", spec.cluster.scheduler,
                                    note=f"{script.name} exited with status {rc}: not requeued")
            if self.eval_after and rc > 0:
                self._evaluate(run_dir, str(env.job_id))  # a failure after the final save still counts as trained
            raise RuntimeError(f"{script} exited with status {rc}; see the job's logs in {self.run_dir}")
        if self.eval_after:
            self._evaluate(run_dir, str(env.job_id))
        elif spec.recipe.eval.enabled and not spec.recipe.eval.tasks and env.global_rank == 0:
            print(f"hpc-grpo: no evaluation after training: {spec.recipe.eval.skipped_why(spec.recipe.grpo.reward)}",
                  flush=True)
        return rc

    def _evaluate(self, run_dir: Path, job_id: str) -> None:
        """cluster=local: the eval job's in-job side, run here; it evaluates only if the run is trained."""
        evaluate.EvalJob(evaluate.job_argv(run_dir, after=job_id))()

    def _request_save(self) -> None:
        """Ask the training process for a save at its next step end: a request file (read at every step end,
        also when the signal came during its start-up) and the signal itself."""
        if self._attempt is None:
            return
        save_request.write_request(Path(self.run_dir), self._attempt)
        proc = self._proc
        if proc is not None and proc.poll() is None:
            try:
                os.kill(proc.pid, signal.SIGUSR2)  # launch.sh execs the trainer: same pid
            except ProcessLookupError:
                pass

    def checkpoint(self, *args: Any, **kwargs: Any) -> submitit.helpers.DelayedSubmission | None:
        """Called by submitit on USR2 (time-limit warning, preemption, scancel --signal; global rank 0 only).

        trl: ask the training process for a save at its next step boundary (hpc_grpo.job.save_signal) and wait
        for it, at most the signal delay. verl has no save hook: its last periodic save is what survives. Then
        decide (hpc_grpo.runstate.restart): requeue, or stop and say why in the history.
        """
        env = submitit.JobEnvironment()
        run_dir = Path(self.run_dir)
        spec = load_frozen(layout.spec_file(run_dir))
        if spec.cluster.restart == "chain":
            # Only reached when the signal came before __call__ installed the chained handler (its first second).
            runs.append_history(run_dir, env.job_id, "failed", "slurm",
                                note="USR2 came while the job was starting: chained mode cannot carry on; "
                                     "`hpc-grpo resume` restarts from the newest checkpoint")
            return None
        if self._save_and_decide(spec, str(env.job_id)) is not None:
            return None
        return submitit.helpers.DelayedSubmission(TrainJob(self.run_dir, self.after, self.eval_after))

    def _container_signal(self) -> None:
        """USR2 in a container (every task gets it; rank 0 acts): save and decide as checkpoint() does, then ask
        the batch script for the requeue (a file it reads once the step ends), since the image has no Slurm client.
        Raises what __call__ turns into the task's end."""
        env = submitit.JobEnvironment()
        if env.global_rank != 0:
            return
        spec = load_frozen(layout.spec_file(Path(self.run_dir)))
        why_not = self._save_and_decide(spec, str(env.job_id))
        if why_not is not None:
            raise _NotRequeued(why_not)
        request = layout.requeue_request(self.run_dir, str(env.job_id))
        request.write_text(f"{self._attempt}\n", encoding="utf-8")
        raise _StopForRequeue()

    def _save_and_decide(self, spec: RunSpec, job_id: str) -> str | None:
        """The save on the signal (trl), then requeue or not (hpc_grpo.runstate.restart), recorded in the history:
        None to requeue, else why not. Raises _TrainingFinished when training ended meanwhile."""
        run_dir = Path(self.run_dir)
        t0 = time.monotonic()
        saved = self._wait_for_save(spec) if get_engine(spec.recipe.engine).traits.saves_on_signal else None
        if saved is None and self._finished():
            raise _TrainingFinished()  # it trained to the end meanwhile: nothing to requeue
        left = self._time_left_s(job_id, spec)
        decision = restart.decide_for_run(run_dir, spec, left)
        what = (f"saved step {saved} in {time.monotonic() - t0:.1f} s" if saved is not None
                else "no save on the signal: resumes from the newest complete checkpoint")
        note = f"{decision.reason}; {what}; {'?' if left is None else left} s were left"
        print(f"hpc-grpo: USR2: {note}", flush=True)
        if not decision.requeue:
            runs.append_history(run_dir, job_id, "failed", "slurm", note=note)
            return decision.reason
        runs.append_history(run_dir, job_id, "requeue", "slurm", note=note)
        return None

    def _time_left_s(self, job_id: str, spec: RunSpec) -> int | None:
        """Slurm's answer (squeue); where the task cannot ask (no Slurm client in a container image), the time limit
        less the time since this task started (a requeued job starts its clock again)."""
        from hpc_grpo.cluster import slurm

        try:
            return slurm.time_left_s(job_id)
        except slurm.SlurmError:
            if not spec.cluster.setup.container or not self._started:
                return None
            return max(0, int(spec.recipe.resources.time_min * 60 - (time.time() - self._started)))

    def _stop_trainer(self) -> None:
        """End the training process (verl: it has not stopped by itself) before the task exits: SIGTERM, then
        SIGKILL after 30 s."""
        proc = self._proc
        if proc is None or self._exited():
            return
        proc.terminate()
        end = time.monotonic() + 30
        while not self._exited() and time.monotonic() < end:
            time.sleep(0.1)
        if not self._exited():
            proc.kill()

    def _wait_for_save(self, spec: RunSpec) -> int | None:
        """Request the save and wait for the training process to save and exit; the step it saved, or None."""
        proc = self._proc
        if proc is None:
            return None
        self._request_save()
        budget = restart.save_budget_s(spec.cluster.signal_delay_s)
        deadline = time.monotonic() + budget
        while not self._exited() and time.monotonic() < deadline:
            time.sleep(0.1)
        if not self._exited():
            # No save in time. It holds SIGTERM off while its save is pending, and once this process is gone it
            # would outlive the job (an orphan escapes Slurm's process tracking) and write beside the requeued one.
            print(f"hpc-grpo: no save within {budget:.0f} s of the signal: stopping the trainer", flush=True)
            proc.kill()
            end = time.monotonic() + 30
            while not self._exited() and time.monotonic() < end:
                time.sleep(0.1)
            return None
        marker = save_request.read_marker(Path(self.run_dir))
        return int(marker["step"]) if marker and marker.get("pid") == proc.pid else None

    def _exited(self) -> bool:
        """Whether the training process has ended. Inside the signal handler Popen.poll() cannot reap it (the
        interrupted main thread may hold Popen's lock), so a zombie in /proc also counts as ended."""
        proc = self._proc
        if proc is None or proc.poll() is not None:
            return True
        return procstat.ended(proc.pid)

    def _finished(self) -> bool:
        """The training process ended by finishing the run (its done file written during this attempt)."""
        if self._proc is None or not self._exited():
            return False
        if self._proc.returncode == 0:
            return True
        done = layout.done_file(self.run_dir)
        return done.is_file() and done.stat().st_mtime >= self._started


class TemplateSlurmExecutor(submitit.SlurmExecutor):
    """submitit's SlurmExecutor, with the batch script rendered from templates/sbatch.sh.j2.

    submitit's own timeout count is made unreachable: hpc_grpo.runstate.restart decides (preemptions never count, time
    limits up to resources.max_timeout_requeues), and submitit counts every USR2 as a timeout when the time
    limit is 10 minutes or less.
    """

    def __init__(self, spec: RunSpec, extra_sbatch: list[tuple[str, Any]] | None = None,
                 eval_job: bool = False) -> None:
        # python: the frozen interpreter, so the srun line runs the same one as every other in-job step.
        super().__init__(folder=layout.submitit_dir(spec.path), max_num_timeout=1_000_000,
                         python=shlex.quote(spec.python))
        self.spec = spec
        self.extra_sbatch = list(extra_sbatch or [])
        self.eval_job = eval_job  # the run's eval job: scripts/eval_sbatch.sh's text (render.render_eval_sbatch)
        self.last_script = ""

    def _make_submission_file_text(self, command: str, uid: str) -> str:
        make = render.render_eval_sbatch if self.eval_job else render.render_sbatch
        self.last_script = make(self.spec, command, extra=self.extra_sbatch)
        return self.last_script


class SweepArrayExecutor(TemplateSlurmExecutor):
    """One Slurm job array for a sweep's members, through submitit's array machinery (one batch script, one
    pickled callable per task in the array's submitit folder, job ids ARRAY_TASK), with two differences from
    submitit's own `submit_array`: the batch script is hpc-grpo's template, and the task indices are the members'
    (`resume SWEEP` queues only the unfinished ones, e.g. --array=1,3%2), so task I always runs member I."""

    def __init__(self, pattern: RunSpec, folder: Path, indices: list[int], parallel: int, prefix: str,
                 recreate: list[str]) -> None:
        submitit.SlurmExecutor.__init__(self, folder=folder, max_num_timeout=1_000_000,
                                        python=shlex.quote(pattern.python))
        self.spec = pattern
        self.extra_sbatch = [("array", sbatch.array(indices, parallel))]
        self.eval_job = False
        self.last_script = ""
        self.indices = list(indices)
        self.prefix = prefix
        self.recreate = list(recreate)

    def _make_submission_file_text(self, command: str, uid: str) -> str:
        self.last_script = render.render_array_sbatch(self.spec, command, self.extra_sbatch, self.prefix,
                                                      self.recreate)
        return self.last_script

    def submit_members(self, fns: list[Any]) -> list[Any]:
        """Queue the array; task `indices[k]` runs `fns[k]`. The pickles are written before sbatch and moved to
        each task's name after it (a task that starts first waits for its pickle: submitit's job side)."""
        folder = Path(self.folder)
        folder.mkdir(parents=True, exist_ok=True)
        pickles = []
        for fn in fns:
            delayed = submitit.helpers.DelayedSubmission(fn)
            delayed.set_timeout(self.parameters.get("time", 5), self.max_num_timeout)
            path = folder / f"{uuid.uuid4().hex}.pkl"
            delayed.dump(path)
            pickles.append(path)
        first = self._submit_command(self._submitit_command_str)
        tasks = list(range(self._num_tasks()))
        jobs: list[Any] = [submitit.SlurmJob(folder=self.folder, job_id=f"{first.job_id}_{i}", tasks=tasks) for i in self.indices]
        for job, path in zip(jobs, pickles):
            job.paths.move_temporary_file(path, "submitted_pickle")
        return jobs


def slurm_parameters(spec: RunSpec) -> dict[str, Any]:
    """The same numbers the template uses, so submitit's own bookkeeping (task count) agrees."""
    r, c = spec.recipe, spec.cluster
    params: dict[str, Any] = {
        "job_name": spec.run_name,
        "nodes": r.resources.nodes,
        "ntasks_per_node": 1,
        "cpus_per_task": spec.cpus_per_task,
        "time": r.resources.time_min,
        "signal_delay_s": c.signal_delay_s,
    }
    if spec.gpus_per_node:
        params["gpus_per_node"] = spec.gpus_per_node
    return params


def write_run(spec: RunSpec, files: dict[str, str]) -> None:
    render.write_files(spec.path, files)
    layout.checkpoints_dir(spec.path).mkdir(exist_ok=True)


def submit_run(spec: RunSpec, files: dict[str, str], purpose: str = "train", note: str = "",
               data: dict[str, Any] | None = None) -> Submission:
    """Create the run directory, write the frozen spec and scripts, submit, record the job id (with a note and
    details, e.g. what `hpc-grpo resume` resumes from).

    The caller has run the plan for submission (planning.plan.run_plan, for_submit=True): its preflight is the one
    check of the request against what Slurm's partition has (planning.preflight.check_slurm)."""
    restart.check(spec)
    with runs.submit_lock(spec.path):
        runs.refuse_if_live(spec.path)
        write_run(spec, files)
        if spec.cluster.scheduler == "slurm":
            return _submit_slurm(spec, purpose, note, data)
        return _submit_local(spec, purpose, note, data)


def submit_sweep_array(members: list[RunSpec], files: list[dict[str, str]], indices: list[int], sweep_dir: Path,
                       sweep: str, parallel: int, recreate: list[str], purpose: str = "train",
                       notes: list[str] | None = None) -> list[Submission]:
    """Write each member's run directory and queue them all as one job array with at most `parallel` tasks
    running at once; then each member's eval job, afterany its own task. Every member's history gets its task's
    job id (ARRAY_TASK) with `purpose`, so status, resume and prune treat it as any run's job.

    The caller has planned every member (planning.plan.run_plan, for_submit=True) and checked that they ask
    Slurm for the same allocation: one array has one batch script."""
    for spec in members:
        restart.check(spec)
    with contextlib.ExitStack() as locks:
        for spec in members:
            locks.enter_context(runs.submit_lock(spec.path))
            runs.refuse_if_live(spec.path)
        for spec, rendered in zip(members, files):
            write_run(spec, rendered)
            layout.submitit_dir(spec.path).mkdir(exist_ok=True)  # Slurm opens each task's log there, not submitit
        pattern = members[0].model_copy(update={"run_name": sweep,
                                                "run_dir": str(layout.member_dir(sweep_dir, sweep, "%a"))})
        prefix = str(layout.member_dir(sweep_dir, sweep, ""))
        executor = SweepArrayExecutor(pattern, layout.submitit_dir(sweep_dir), indices, parallel, prefix, recreate)
        executor.update_parameters(**slurm_parameters(pattern))
        jobs = executor.submit_members([TrainJob(spec.run_dir) for spec in members])
        script = layout.sbatch_script(sweep_dir)
        script.parent.mkdir(parents=True, exist_ok=True)
        script.write_text(executor.last_script)
        out = []
        for k, (spec, job) in enumerate(zip(members, jobs)):
            note = (notes[k] + "; " if notes else "") + f"sweep {sweep}, array task {job.job_id}"
            runs.append_history(spec.path, job.job_id, purpose, "slurm", note=note, data={"sweep": sweep})
            eval_job = None
            if evaluate.queued_after_training(spec):
                eval_job = submit_eval(spec, evaluate.job_argv(spec.path, after=job.job_id), after=job.job_id)
            out.append(Submission(spec.path, job.job_id, "slurm", str(layout.job_log(spec.path, job.job_id)), job,
                                  eval_job))
    return out


def _submit_slurm(spec: RunSpec, purpose: str, note: str = "", data: dict[str, Any] | None = None) -> Submission:
    executor = TemplateSlurmExecutor(spec)
    executor.update_parameters(**slurm_parameters(spec))
    job = executor.submit(TrainJob(spec.run_dir))
    # Same text Slurm received; equal to the rendered one.
    layout.sbatch_script(spec.path).write_text(executor.last_script)
    runs.append_history(spec.path, job.job_id, purpose, "slurm", note=note, data=data)
    log = layout.job_log(spec.path, job.job_id)
    eval_job = None
    if evaluate.queued_after_training(spec):
        # Chained mode: this first job ends by its time limit and the run goes on in follow-ons with new job ids, so
        # an evaluation after this job would only find the run untrained; `hpc-grpo eval RUN` evaluates the finished run.
        eval_job = submit_eval(spec, evaluate.job_argv(spec.path, after=job.job_id), after=job.job_id)
    return Submission(spec.path, job.job_id, "slurm", str(log), job, eval_job)


def _submit_local(spec: RunSpec, purpose: str, note: str = "", data: dict[str, Any] | None = None) -> Submission:
    executor = submitit.LocalExecutor(folder=layout.submitit_dir(spec.path), python=shlex.quote(spec.python))
    executor.update_parameters(timeout_min=spec.recipe.resources.time_min, nodes=1, tasks_per_node=1,
                               gpus_per_node=spec.gpus_per_node)
    with controller_stdio(layout.submitit_dir(spec.path) / LOCAL_CONTROLLER_LOG):
        job = executor.submit(TrainJob(spec.run_dir, eval_after=spec.recipe.eval.runs))
    runs.append_history(spec.path, job.job_id, purpose, "local", note=note, data=data)
    log = layout.job_log(spec.path, job.job_id)
    return Submission(spec.path, job.job_id, "local", str(log), job)


LOCAL_CONTROLLER_LOG = "controller.log"


@contextlib.contextmanager
def controller_stdio(log: Path) -> Iterator[None]:
    """submitit's local controller outlives this command and inherits its stdin, stdout and stderr: under a pipe
    (`| tee`, a CI step, a captured subprocess) the reader would wait until the job ends, so `--no-wait` would
    wait after all. While it starts, fd 0 is /dev/null and fds 1 and 2 are the controller's own log."""
    log.parent.mkdir(parents=True, exist_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(fd) for fd in (0, 1, 2)]
    try:
        with open(os.devnull, "rb") as null, open(log, "ab") as out:
            os.dup2(null.fileno(), 0)
            os.dup2(out.fileno(), 1)
            os.dup2(out.fileno(), 2)
            yield
    finally:
        for fd, copy in zip((0, 1, 2), saved):
            os.dup2(copy, fd)
            os.close(copy)


def submit_follow_on(spec: RunSpec, after: str) -> str:
    """Chained mode: queue the run's next job, to start only if job `after` does not end well (afternotok).

    Submitted from inside a job (submit_detached). `--kill-on-invalid-dep` removes the follow-on when `after`
    completes, so it never waits forever.
    """
    executor = TemplateSlurmExecutor(spec, extra_sbatch=sbatch.follow_on(after))
    executor.update_parameters(**slurm_parameters(spec))
    return str(submit_detached(executor, TrainJob(spec.run_dir, after=after)).job_id)


def submit_detached(executor: submitit.Executor, fn: Any) -> Any:
    """Submit `fn` as a job of its own, also from inside a job: the chained follow-on and the eval job.

    submitit's clean_env() drops the surrounding job's SLURM_* variables (the new job would inherit its
    allocation's), SLURM_CONF too, which the clients need to find a non-system cluster: that one is put back."""
    conf = os.environ.get("SLURM_CONF")
    with submitit.helpers.clean_env():
        if conf:
            os.environ["SLURM_CONF"] = conf
        return executor.submit(fn)


def submit_eval(spec: RunSpec, argv: list[str], after: str | None = None) -> Submission:
    """Queue the run's eval job on Slurm (afterany `after` when given: the job checks the run is trained), from a
    clean environment, with the eval job's own resources (evaluation.evaluate.eval_spec)."""
    executor = TemplateSlurmExecutor(spec, extra_sbatch=[("dependency", evaluate.dependency(after))] if after
                                     else None, eval_job=True)
    executor.update_parameters(**slurm_parameters(evaluate.eval_spec(spec)))
    job = submit_detached(executor, evaluate.EvalJob(argv))
    if executor.last_script:  # what Slurm received: the rendered script plus the dependency
        script = layout.eval_sbatch_script(spec.path)
        script.parent.mkdir(parents=True, exist_ok=True)
        script.write_text(executor.last_script)
    runs.append_history(spec.path, job.job_id, "eval", "slurm", note=evaluate.dependency(after) if after else "")
    return Submission(spec.path, job.job_id, "slurm", str(layout.job_log(spec.path, job.job_id)), job)
