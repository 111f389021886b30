"""Every file and folder of a run directory, named here and nowhere else.

A run directory is read days later from any login node, by code written at different times (the job, status,
resume, prune, eval, report): one spelling of each name keeps them all looking at the same place, and a rename is
one edit. Callers build paths with the functions below (they take the run directory, str or Path); a name is
spelled as a literal only in this module (tests/unit/test_layout.py enforces it).

What is inside an engine's checkpoint folder (global_step_N/actor/, checkpoint-N/trainer_state.json, verl's
tracker file) is the checkpoint layout, owned by hpc_grpo.runstate.checkpoints. Stdlib only: status and prune
import it.

RUN/
  spec.yaml                 the frozen spec (render; every in-job step reads it)
  history.jsonl             one line per submission and per job event (runstate.runs)
  scripts/                  sbatch.sh, launch.sh, eval_sbatch.sh (render, submit)
  submitit/                 submitit's folder: JOB_TASK_log.out/.err per node, JOB_0_result.pkl, pickles
  ray/JOB/                  verl's per-allocation marker files shared by the nodes (StateFiles)
  checkpoints/              the engine's checkpoints (verl: default_local_dir; trl: output_dir)
  checkpoints-incomplete/   checkpoints set aside by resume preparation
  leases/step_N.HOST.ID.PID.lease   reader leases (evaluation, export) that prune respects
  .checkpoints.lock, .submit.lock   the run's lease locks (runstate.runs)
  metrics.jsonl             one row per step (trl's callback; verl's file-logger rows copied by the prune poller)
  verl_metrics.jsonl        verl's file logger (VERL_FILE_LOGGER_PATH), rewritten at each start
  train_done.json           written by a training that reached its last step
  prompt_lengths.json       trl: the tokenised prompt lengths, cached
  save_request, signal_save.json    the save-on-signal request and what it saved (job.save_signal)
  exports/step_N/           a checkpoint as a Hugging Face folder, export.json inside once whole
  eval/step_N.json, eval/tasks/     evaluation results and the local lm-eval task files
  probe.json                the ray-probe recipe's answer
  .hpc-grpo-reserve         a job's ballast, given up first on a full disk
  rehearsal-data/           `hpc-grpo rehearse`: the shrunk data set
  report.png                `hpc-grpo report`'s default picture
RUNS_ROOT/_base-evals/KEY.json      base-model scores, shared by the runs of one runs root
RUNS_ROOT/SWEEP/                    a sweep (`hpc-grpo sweep`): one Slurm job array over its members
  sweep.json                the manifest: the recipe, cluster, axes, each member's index, name and overrides
  SWEEP-mI/                 member I: an ordinary run directory (array task I runs it)
  submitit/                 submitit's folder of the array: its batch script and each task's pickle
  scripts/sbatch.sh         the array's batch script, as Slurm received it
  report.png                `hpc-grpo report SWEEP`: the members' curves overlaid
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from collections.abc import Callable
from pathlib import Path

PathLike = str | Path

# ------------------------------------------------------------------------------------------------ names
SPEC_FILE = "spec.yaml"
HISTORY_FILE = "history.jsonl"
SCRIPTS_DIR = "scripts"
SBATCH_SCRIPT = f"{SCRIPTS_DIR}/sbatch.sh"  # relative to the run directory, as render_all keys its files
LAUNCH_SCRIPT = f"{SCRIPTS_DIR}/launch.sh"
EVAL_SBATCH_SCRIPT = f"{SCRIPTS_DIR}/eval_sbatch.sh"  # the eval job's batch script, beside the training job's
SUBMITIT_DIR = "submitit"
RAY_DIR = "ray"
# verl's marker files in ray/JOB/, one set per allocation (NAME.ATTEMPT; a stopped worker: stopped.ATTEMPT.NODE)
DRIVER_EXITED = "driver-exited"
JOINED = "joined"
RESUME_ARGS = "resume-args"
STOPPED = "stopped"
CHECKPOINTS_DIR = "checkpoints"
QUARANTINE_DIR = "checkpoints-incomplete"
LEASES_DIR = "leases"
CHECKPOINT_LOCK = ".checkpoints.lock"
SUBMIT_LOCK = ".submit.lock"
METRICS_FILE = "metrics.jsonl"
VERL_LOG = "verl_metrics.jsonl"  # verl's file logger (VERL_FILE_LOGGER_PATH), rewritten from scratch at each start
DONE_FILE = "train_done.json"  # written atomically by a training that reached its last step
PROMPT_LENGTHS_FILE = "prompt_lengths.json"
SAVE_REQUEST = "save_request"
SAVE_MARKER = "signal_save.json"
# REQUEUE_REQUEST.JOB: a container job asks its batch script (outside the container) to requeue it
REQUEUE_REQUEST = "requeue_request"
EXPORTS_DIR = "exports"
EXPORT_MARKER = "export.json"  # inside exports/step_N/, written before the folder is renamed into place
EVAL_DIR = "eval"
EVAL_TASKS_DIR = "tasks"  # inside eval/
PROBE_FILE = "probe.json"
RESERVE_FILE = ".hpc-grpo-reserve"  # the job's ballast, removed first on a full disk (job.disk)
REHEARSAL_DATA_DIR = "rehearsal-data"  # `hpc-grpo rehearse`: the shrunk data set
REPORT_FILE = "report.png"
BASE_EVALS_DIR = "_base-evals"  # in the runs root, not in a run directory
CALIBRATION_FILE = "_step-time-calibration.jsonl"  # in the runs root: runstate.calibration
SWEEP_FILE = "sweep.json"  # in a sweep's folder (RUNS_ROOT/SWEEP/), beside its members' run directories
_MEMBER = "{sweep}-m{index}"  # a member's run name (and folder) in its sweep's folder
ARRAY_JOB = "%A_%a"  # Slurm's file-name pattern of an array task's id (ARRAY_TASK), as submitit names it

# submitit's names in its folder (submitit.core.utils.JobPaths): JOB_TASK_log.out / .err, JOB_TASK_result.pkl
_LOG = "{job}_{task}_log.{stream}"
_RESULT = "{job}_{task}_result.pkl"
_STEP = "step_"  # how exports/, eval/ and leases/ name a step: step_N
_EVAL_RESULT = re.compile(rf"{_STEP}(\d+)\.json")


def _step(step: int) -> str:
    return f"{_STEP}{int(step)}"


def _in_run(name: str) -> Callable[[PathLike], Path]:
    """The path function of one name: run directory -> RUN_DIR/name."""

    def path(run_dir: PathLike) -> Path:
        return Path(run_dir) / name

    path.__doc__ = f"RUN_DIR/{name}"
    return path


# ------------------------------------------------------------------------------------- one name, one path
spec_file = _in_run(SPEC_FILE)
history_file = _in_run(HISTORY_FILE)
sbatch_script = _in_run(SBATCH_SCRIPT)
launch_script = _in_run(LAUNCH_SCRIPT)
eval_sbatch_script = _in_run(EVAL_SBATCH_SCRIPT)
submitit_dir = _in_run(SUBMITIT_DIR)
ray_dir = _in_run(RAY_DIR)
checkpoints_dir = _in_run(CHECKPOINTS_DIR)  # for both engines: verl's default_local_dir, trl's output_dir
quarantine_dir = _in_run(QUARANTINE_DIR)
checkpoint_lock = _in_run(CHECKPOINT_LOCK)
submit_lock = _in_run(SUBMIT_LOCK)
leases_dir = _in_run(LEASES_DIR)
metrics_file = _in_run(METRICS_FILE)
verl_log = _in_run(VERL_LOG)
done_file = _in_run(DONE_FILE)
prompt_lengths_file = _in_run(PROMPT_LENGTHS_FILE)
save_request = _in_run(SAVE_REQUEST)
save_marker = _in_run(SAVE_MARKER)
probe_file = _in_run(PROBE_FILE)
reserve_file = _in_run(RESERVE_FILE)
rehearsal_data_dir = _in_run(REHEARSAL_DATA_DIR)
exports_dir = _in_run(EXPORTS_DIR)
eval_dir = _in_run(EVAL_DIR)
report_file = _in_run(REPORT_FILE)


def find_specs(root: PathLike) -> list[Path]:
    """The spec file of every run directory under a runs root: directly under it, and the members of its sweeps."""
    root = Path(root)
    members = [p for m in root.glob(f"*/{SWEEP_FILE}") for p in m.parent.glob(f"*/{SPEC_FILE}")]
    return list(root.glob(f"*/{SPEC_FILE}")) + members


# ------------------------------------------------------------------------------------------------ sweeps
def sweep_file(sweep_dir: PathLike) -> Path:
    """SWEEP/sweep.json: the sweep's manifest."""
    return Path(sweep_dir) / SWEEP_FILE


def member_name(sweep: str, index: int | str) -> str:
    """Member I's run name, SWEEP-mI; index "%a" gives Slurm's pattern of an array task's member."""
    return _MEMBER.format(sweep=sweep, index=index)


def member_dir(sweep_dir: PathLike, sweep: str, index: int | str) -> Path:
    """Member I's run directory in the sweep's folder (index "%a": the array script's pattern)."""
    return Path(sweep_dir) / member_name(sweep, index)


# ------------------------------------------------------------------------------------------------ the jobs
def job_log(run_dir: PathLike, job_id: str, task: int | str = 0, err: bool = False) -> Path:
    """One task's stdout (or stderr) of a job: task N runs on node N, task 0's is the driver's. Slurm's patterns
    work too: job_log(run, "%j", "%t") is what srun's --output takes."""
    return submitit_dir(run_dir) / _LOG.format(job=job_id, task=task, stream="err" if err else "out")


def log_patterns(run_dir: PathLike, task: int | str, job: str = "%j") -> tuple[str, str]:
    """Slurm's --output and --error patterns for the run's job logs: %j is the job id (ARRAY_JOB in a job array);
    `task` a task number, or "%t" for srun's one log per task."""
    return str(job_log(run_dir, job, task)), str(job_log(run_dir, job, task, err=True))


def requeue_request(run_dir: PathLike, job_id: str) -> Path:
    """RUN_DIR/requeue_request.JOB; with job_id "" the prefix the batch script completes with $SLURM_JOB_ID."""
    return Path(run_dir) / f"{REQUEUE_REQUEST}.{job_id}"


def job_result(run_dir: PathLike, job_id: str) -> Path:
    """submitit's result pickle of a job's task 0: ("success", value) or ("error", traceback)."""
    return submitit_dir(run_dir) / _RESULT.format(job=job_id, task=0)


def driver_logs(run_dir: PathLike) -> list[Path]:
    """Task 0's stdout of every job of the run, in name order."""
    folder = submitit_dir(run_dir)
    return sorted(folder.glob(_LOG.format(job="*", task=0, stream="out"))) if folder.is_dir() else []


@dataclass(frozen=True, slots=True)
class StateFiles:
    """Marker files of one allocation (attempt) of a job, shared by its nodes (RUN_DIR/ray/JOB/ on the shared
    run directory): node 0's driver has exited, every node has joined, the resume overrides, a worker has stopped."""

    folder: Path
    attempt: int | str  # a str only where a path is shown with a placeholder (ATTEMPT)

    @property
    def done(self) -> Path:
        return self.folder / f"{DRIVER_EXITED}.{self.attempt}"

    @property
    def joined(self) -> Path:
        return self.folder / f"{JOINED}.{self.attempt}"

    @property
    def resume_args(self) -> Path:
        return self.folder / f"{RESUME_ARGS}.{self.attempt}"

    def stopped(self, node_index: int) -> Path:
        return self.folder / f"{STOPPED}.{self.attempt}.{node_index}"

    def workers(self, nodes: int) -> list[Path]:
        return [self.stopped(i) for i in range(1, nodes)]


def state_files(ray_folder: PathLike, job_id: str, attempt: int | str) -> StateFiles:
    """The marker files of one attempt of a job under the run's ray folder (the launch script passes it)."""
    return StateFiles(Path(ray_folder) / job_id, attempt)


# ------------------------------------------------------------------------------------------------ leases
def lease_file(run_dir: PathLike, step: int, host: str, token: str, pid: int) -> Path:
    """A reader's lease on one step: step_N.HOST.TOKEN.PID.lease (the host may hold dots)."""
    return leases_dir(run_dir) / f"{_step(step)}.{host}.{token}.{pid}.lease"


def parse_lease(name: str) -> tuple[int, str, int] | None:
    """(step, host, pid) of a lease file name; None for any other name."""
    parts = name.split(".")
    if len(parts) < 5 or not parts[0].startswith(_STEP) or parts[-1] != "lease":
        return None
    try:
        return int(parts[0][len(_STEP):]), ".".join(parts[1:-3]), int(parts[-2])
    except ValueError:
        return None


# -------------------------------------------------------------------------------------- exports and evaluation
def export_dir(run_dir: PathLike, step: int) -> Path:
    return exports_dir(run_dir) / _step(step)


def export_marker(folder: PathLike) -> Path:
    """The marker inside one export folder (or the temporary folder it is built in)."""
    return Path(folder) / EXPORT_MARKER


def exports_done(run_dir: PathLike) -> list[Path]:
    """The marker of every whole export of the run."""
    return sorted(exports_dir(run_dir).glob(f"{_STEP}*/{EXPORT_MARKER}"))


def eval_result(run_dir: PathLike, step: int) -> Path:
    return eval_dir(run_dir) / f"{_step(step)}.json"


def eval_results(run_dir: PathLike) -> list[tuple[int, Path]]:
    """(step, file) of every evaluation result of the run, by step; none when the folder is missing."""
    folder = eval_dir(run_dir)
    try:
        names = [p.name for p in folder.iterdir()]
    except OSError:
        return []
    found = [(int(m.group(1)), folder / n) for n in names if (m := _EVAL_RESULT.fullmatch(n))]
    return sorted(found)


def eval_tasks_dir(run_dir: PathLike) -> Path:
    return eval_dir(run_dir) / EVAL_TASKS_DIR


def base_eval_file(runs_root: PathLike, key: str) -> Path:
    """Cached base-model scores under the runs root (shared by all nodes and all runs of that root)."""
    return Path(runs_root) / BASE_EVALS_DIR / f"{key}.json"


def calibration_file(runs_root: PathLike) -> Path:
    """The step-time calibrations of the runs under this root, one JSON line each (runstate.calibration)."""
    return Path(runs_root) / CALIBRATION_FILE
