"""What a container job (cluster.setup.container) needs of its profile, checked before it is queued.

The job sees only what is mounted (hpc_grpo.config.mounts.job_mounts): a model, a data file or a venv outside every
mount is simply absent inside, and the job dies minutes in, after the queue wait. So every path the job reads must
lie in a mount that shows it at the same path (the job names host paths), symlinks followed. These are facts of
the profile and the recipe, not of what this machine sees, so they are errors in plan as in submit.

The image has no Slurm client (a stock NGC image has none, and a client inside would also need the site's slurm.conf,
munge socket and a matching Slurm version): requeue is asked of the batch script, outside the container
(launch.submit.TrainJob). Chained mode queues each follow-on from inside the job, so it is refused here.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

import hpc_grpo
from hpc_grpo.common.findings import Finding, error, info, warning
from hpc_grpo.common.yamlio import SpecError
from hpc_grpo.config.mounts import Mount, job_mounts
from hpc_grpo.config.spec import RunSpec
from hpc_grpo.evaluation import evaluate
from hpc_grpo.planning.interpreter import setup_key
from hpc_grpo.planning.preflight import hf_cache_dir


@dataclass(frozen=True, slots=True)
class Read:
    """One path the job reads, and the spec key that names it."""

    key: str
    path: Path
    folder: bool  # the mount to suggest: the path itself (a folder) or its parent (a file)
    # False: the image may hold it at that path (a warning, not an error), and why it matters
    must: bool = True
    note: str = ""


def _local_model(path: str) -> bool:
    return Path(path).is_absolute() or path.startswith(".") or Path(path).exists()


def paths_read(spec: RunSpec) -> list[Read]:
    """Every host path the job reads: the run directory (its checkpoints to resume from), the model (or the Hugging
    Face cache a Hub id loads from), the data files, the eval job's data files, and the job's interpreter with
    where hpc_grpo comes from."""
    r = spec.recipe
    reads = [Read("cluster.runs_root", Path(spec.run_dir), True)]
    if r.launch.driver is None:
        model = r.model.path
        reads.append(Read("model.path", Path(model).absolute(), True) if _local_model(model)
                     else Read("model.path", hf_cache_dir(), True))
        reads += [Read("data.train_files", Path(f).absolute(), False) for f in r.data.train_list]
        reads += [Read("data.val_files", Path(f).absolute(), False) for f in r.data.val_list]
    if evaluate.queued_after_training(spec) and evaluate.needs_files(r.eval.tasks):
        try:
            train, test = evaluate.data_files(spec)
            reads += [Read("eval.train_file", Path(train), False), Read("eval.test_file", Path(test), False)]
        except SpecError:
            pass  # plan's eval check says so
    return reads + interpreter_reads(spec)


def interpreter_reads(spec: RunSpec) -> list[Read]:
    """The job's python when it is a host path (setup.python, setup.venv: the image's own python3 needs nothing):
    its venv, the Python the venv was made from, and, when it is the venv running this, the hpc_grpo package it
    imports (a checkout on PYTHONPATH or an editable install lives outside the venv)."""
    python = Path(spec.python)
    if not python.is_absolute():
        return []
    key = setup_key(spec.cluster.setup)
    venv = python.parent.parent
    reads = [Read(key, venv, True)]
    base = venv_base(venv)
    if base is not None:
        reads.append(Read(key, base, True, must=False,
                          note=f"; {venv} runs the Python installed there, so the image must hold it at that path "
                               "(a venv made inside the image always works)"))
    if os.path.realpath(venv) == os.path.realpath(Path(sys.executable).parent.parent):
        reads.append(Read(key, Path(hpc_grpo.__file__).resolve().parent, True))
    return reads


def venv_base(venv: Path) -> Path | None:
    """The installation a venv was made from (pyvenv.cfg's `home` is its bin folder); None: no venv, or unread."""
    try:
        lines = (venv / "pyvenv.cfg").read_text(encoding="utf-8").splitlines()
    except OSError:
        return None
    for line in lines:
        name, _, value = line.partition("=")
        if name.strip() == "home" and value.strip().startswith("/"):
            return Path(value.strip()).parent
    return None


def mount_for(path: Path, mounts: list[Mount]) -> Mount | None:
    """The mount through which the job, opening host `path` at that same path inside the container, finds that
    very file: the innermost mount covering the path (mounts come parents first, a later one over an earlier one),
    if it brings the path from the same place. None: the job finds nothing there, or another file."""
    inside = PurePosixPath(path)
    covering = [m for m in mounts if m.covers_inside(inside)]
    if not covering:
        return None
    top = covering[-1]
    return top if top.src / inside.relative_to(top.dst) == inside else None


def unmounted(read: Read, mounts: list[Mount]) -> Finding | None:
    """An error when the path, or where its symlinks lead, is not shown at its own path inside the container."""
    real = Path(os.path.realpath(read.path))
    for path in dict.fromkeys([read.path, real]):
        if mount_for(path, mounts) is not None:
            continue
        suggest = path if read.folder else path.parent
        via = f" ({read.path} leads there through a symlink)" if path != read.path else ""
        elsewhere = next((m for m in mounts if m.covers_host(PurePosixPath(path))), None)
        if elsewhere is not None:
            why = (f"{path}{via} is mounted at {elsewhere.dst} inside the container ({elsewhere.text()}), but the job "
                   "opens it at its host path")
            fix = f"mount it at its own path: cluster.setup.mounts: [{elsewhere.src}]"
        else:
            seen = ", ".join(str(m.dst) for m in mounts)
            why = f"{path}{via} is not inside the container: the job sees only {seen} of the host"
            fix = f"add a mount to the profile: cluster.setup.mounts: [{suggest}] (or a folder above it)"
        return (error if read.must else warning)(read.key, why + read.note, fix)
    return None


def check_container(spec: RunSpec) -> list[Finding]:
    """plan's container checks; nothing for a job without a container."""
    setup = spec.cluster.setup
    if not setup.container or spec.cluster.scheduler != "slurm":
        return []
    mounts = job_mounts(spec.cluster.shared_path_list(), setup.mounts, spec.run_dir)
    out = [info("cluster.setup.mounts", "the container sees " + ", ".join(m.text() for m in mounts))]
    out += [f for read in paths_read(spec) if (f := unmounted(read, mounts)) is not None]
    if spec.cluster.restart == "chain":
        out.append(error("cluster.restart", "restart=chain queues each follow-on job from inside the job (sbatch, "
                         f"sacct), and the container {setup.container} has no Slurm client",
                         "use cluster.restart=requeue (the batch script, outside the container, requeues the job)"))
    launcher = setup.container_launcher
    if launcher and not os.access(launcher, os.X_OK):
        out.append(warning("cluster.setup.container_launcher", f"{launcher} is not an executable file here",
                           "point it at the launcher the compute nodes run"))
    return out
