"""The job's interpreter: can it run the engine's job? Asked before queueing, not minutes into the job.

A verl job that starts in an interpreter without verl's trainer dies at its start (`No module named 'codetiming'`),
after the queue wait on a real cluster. So preflight runs the job's interpreter (spec.python, as the profile's
setup decides it) and imports what the engine's job imports (engines/*: job_imports), once per interpreter
(planning.python_probe caches it). Where the interpreter exists only on the compute nodes (inside a container, after
`module load`, python3 of a conda env activated there) it cannot be tried here: plan says so.

On the profiles whose nodes are this machine (local, slurm-dev), a verl recipe with no interpreter set up runs the
checkout's .venv-verl when the submitting interpreter cannot run verl (choose_interpreter): the quickstart's .venv has
only verl's config files, and `bash tools/setup-env.sh verl` builds .venv-verl beside it.
"""

from __future__ import annotations

import sys
from pathlib import Path

from hpc_grpo.common.findings import Finding, Make, info, warning
from hpc_grpo.config.cluster import Setup
from hpc_grpo.config.resolve import job_python
from hpc_grpo.config.spec import RunSpec
from hpc_grpo.engines import get_engine
from hpc_grpo.engines.base import JobImports
from hpc_grpo.planning.python_probe import Probe, probe

# Profiles whose nodes are this machine, so the checkout's venv is at the same path on them.
CHECKOUT_PROFILES = ("local", "slurm-dev")


def checkout_root() -> Path | None:
    """The source checkout hpc_grpo runs from (None for an installed wheel: no venvs beside it)."""
    root = Path(__file__).resolve().parents[2]
    return root if (root / "pyproject.toml").is_file() else None


def checkout_venv(needs: JobImports) -> Path | None:
    """The checkout's venv for this engine, where it has an interpreter."""
    root = checkout_root()
    if root is None or not needs.checkout_venv:
        return None
    venv = root / needs.checkout_venv
    return venv if (venv / "bin" / "python").exists() else None


def setup_key(setup: Setup) -> str:
    """The profile key that decided the interpreter (resolve.job_python's order); venv where none did."""
    for name in ("python", "venv", "conda", "container"):
        if getattr(setup, name):
            return f"cluster.setup.{name}"
    return "cluster.setup.venv"


def not_here(spec: RunSpec) -> str | None:
    """Why the job's interpreter cannot be tried on this machine, or None when it can."""
    s = spec.cluster.setup
    if s.container:
        return f"it runs inside the container {s.container} on the compute nodes"
    if s.modules:
        return f"the job loads the modules {', '.join(s.modules)} first, which this process has not"
    if not Path(spec.python).is_absolute():
        where = f"the conda env {s.conda}, activated on the compute nodes" if s.conda else "the compute nodes' PATH"
        return f"{spec.python} is found in {where}"
    return None


def choose_interpreter(spec: RunSpec) -> tuple[RunSpec, str | None]:
    """On local and slurm-dev, a job no setup names an interpreter for runs the checkout's venv for its engine
    (.venv-verl) when the submitting interpreter cannot import what the job needs: (that spec, why). Any other
    spec comes back as it is, with None. check_interpreter says it again in plan's findings."""
    setup = spec.cluster.setup
    if spec.cluster.name not in CHECKOUT_PROFILES or any((setup.python, setup.venv, setup.conda, setup.container)):
        return spec, None
    needs = get_engine(spec.recipe.engine).job_imports(spec)
    venv = checkout_venv(needs)
    if not needs.modules or venv is None or spec.python != sys.executable or Path(sys.executable).parent.parent == venv:
        return spec, None
    mine = probe(spec.python, needs.modules, needs.env)
    if mine.ok:
        return spec, None
    chosen = setup.model_copy(update={"venv": str(venv)})
    spec = spec.model_copy(update={"cluster": spec.cluster.model_copy(update={"setup": chosen}),
                                   "python": job_python(chosen)})
    return spec, f"the checkout's {needs.checkout_venv}: the submitting interpreter {sys.executable} {describe_failure(mine)}"


def describe_failure(result: Probe) -> str:
    """'cannot import X (module 'Y' is missing); ...' for each module the interpreter failed on."""
    if result.error:
        return f"could not be asked: {result.error}"
    parts = []
    for module, (missing, line) in result.failed.items():
        why = f"module {missing!r} is missing" if missing else line
        parts.append(f"{module} ({why})")
    return "cannot import " + "; ".join(parts)


def fix_for(spec: RunSpec, needs: JobImports) -> str:
    """The engine's way to an environment that has it, and how to point the job at it (this checkout's venv by
    name where the engine has one)."""
    root = checkout_root()
    fix = f"{needs.fix}, then set cluster.setup.venv=VENV to it"
    if root is not None and needs.checkout_venv and spec.python != str(root / needs.checkout_venv / "bin" / "python"):
        fix += f" (this checkout's: cluster.setup.venv={root / needs.checkout_venv}"
        fix += "; cluster=local and slurm-dev use it by themselves)" if spec.cluster.name in CHECKOUT_PROFILES else ")"
    return fix


def check_interpreter(spec: RunSpec, make: Make, refused: bool = False) -> list[Finding]:
    """Import what the engine's job imports in the job's interpreter; refuse (make) what would die at its start.
    `refused`: other checks already refuse the job, so the slow first probe waits until they are fixed."""
    needs = get_engine(spec.recipe.engine).job_imports(spec)
    if not needs.modules:
        return []
    key, python = setup_key(spec.cluster.setup), spec.python
    why = not_here(spec) or ("the errors above refuse the job first; it is checked once they are fixed"
                             if refused else None)
    if why:
        return [info(key, f"the job's interpreter was not checked: {why}; the job imports "
                     f"{', '.join(needs.modules)} at its start")]
    remote = spec.cluster.scheduler == "slurm" and spec.cluster.name not in CHECKOUT_PROFILES
    if remote and not Path(python).exists():
        return [warning(key, f"the job's interpreter {python} does not exist on this machine, so it was not checked: "
                        "the job dies at its start if the compute nodes lack it too",
                        f"create it ({needs.fix}), or set {key} to an interpreter that exists")]
    result = probe(python, needs.modules, needs.env)
    if not result.ok:
        return [make(key, f"the job's interpreter {python} {describe_failure(result)}: the {spec.recipe.engine} job "
                     "would die at its start", fix_for(spec, needs))]
    how = "cached" if result.cached else f"{result.seconds:.1f} s"
    out = [info(key, f"the job's interpreter {python} imports {', '.join(needs.modules)} (checked, {how})")]
    venv = checkout_venv(needs)
    if venv is not None and python == str(venv / "bin" / "python") and sys.executable != python:
        mine = probe(sys.executable, needs.modules, needs.env)
        if not mine.ok:
            out.append(info(key, f"the checkout's {needs.checkout_venv} runs the job: the submitting interpreter "
                            f"{sys.executable} {describe_failure(mine)}"))
    return out
