"""`hpc-grpo sweep`: several settings of one recipe as one Slurm job array, each member an ordinary run.

Every member is resolved and planned as `submit` would plan it before anything is queued; one member that fails
refuses the whole sweep, naming the member and why. The members then share one batch script (they must ask Slurm
for the same allocation) with `--array=...%P`. Each member is a run directory in the sweep's folder
(runstate.layout.member_dir), so status, resume, prune, its chained eval and report work on it as on any run;
`sweep status` and `resume SWEEP` work on all of them. Every member's W&B run joins one group, the sweep's name
(recipe logging.group), where W&B is a logger.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hpc_grpo.cluster import sbatch
from hpc_grpo.commands.resume import ResumePlan, check_plan, plan_resume
from hpc_grpo.commands.status import run_status, runs_roots
from hpc_grpo.common.yamlio import SpecError
from hpc_grpo.config.engine_traits import traits_of
from hpc_grpo.config.fields import check_name
from hpc_grpo.config.spec import RunSpec
from hpc_grpo.config.sweep_grid import members as grid_members
from hpc_grpo.config.sweep_grid import split_axes
from hpc_grpo.runstate import layout, runs, sweeps, trained
from hpc_grpo.runstate import metrics as engine_metrics
from hpc_grpo.runstate.sweeps import Manifest, Member


@dataclass
class SweepPlan:
    """A sweep checked and ready to queue: its folder, manifest, and each member's spec, plan and files."""

    folder: Path
    manifest: Manifest
    specs: list[RunSpec]
    plans: list[Any]
    recreate: list[str]
    notes: list[str] = field(default_factory=list)  # verl key translations, interpreter choices (said once)

    @property
    def indices(self) -> list[int]:
        return [m.index for m in self.manifest.members]


def default_name(recipe: str, now: float | None = None) -> str:
    return f"{recipe}-sweep-{time.strftime('%Y%m%d-%H%M%S', time.localtime(now))}"


def _refuse(member: Member, why: str, key: str = "sweep") -> SpecError:
    return SpecError(f"member {member.index} ({' '.join(member.overrides)}) {why}; nothing was queued", key=key)


def resolve_member(recipe: str, cluster: str, overrides: list[str], member: Member, folder: Path | None,
                   notes: list[str], sweep: str) -> RunSpec:
    """One member's spec, resolved as `submit` resolves its command line, placed in the sweep's folder. Its W&B run
    joins the group named by the sweep (logging.group; one given on the command line wins)."""
    from hpc_grpo.engines.verl_keymap import resolve_with_verl_keys
    from hpc_grpo.planning.interpreter import choose_interpreter

    try:
        resolved, said = resolve_with_verl_keys(recipe, cluster, [f"logging.group={sweep}", *overrides,
                                                                  *member.overrides], run_name=member.name)
    except SpecError as exc:
        raise _refuse(member, f"is invalid: {exc}", exc.key or "sweep") from None
    spec, why = choose_interpreter(resolved)
    if member.index == 0:
        notes += [f"verl key: {n}" for n in said] + ([f"python: {spec.python} ({why})"] if why else [])
    return spec if folder is None else spec.model_copy(update={"run_dir": str(folder / member.name)})


def check_alike(specs: list[RunSpec], manifest: Manifest) -> None:
    """One array has one batch script: every member must ask Slurm for the same allocation, on a Slurm cluster,
    requeued by Slurm (chained mode and container jobs name their own job in files an array cannot share)."""
    first = specs[0]
    if first.cluster.scheduler != "slurm":
        raise SpecError(f"a sweep is a Slurm job array; cluster {first.cluster.name} has scheduler="
                        f"{first.cluster.scheduler}. Use a Slurm cluster profile, or `hpc-grpo submit` each setting",
                        key="cluster")
    if first.cluster.restart == "chain" or first.cluster.setup.container:
        what = "cluster.restart=chain" if first.cluster.restart == "chain" else "a container job (cluster.setup.container)"
        raise SpecError(f"{what} is not supported in a sweep's job array: submit the settings as runs, or sweep on "
                        "a profile that requeues", key="cluster.restart" if "chain" in what else "cluster.setup.container")
    want = dataclasses.replace(sbatch.request(first), job_name="")
    for spec, member in zip(specs[1:], manifest.members[1:]):
        got = dataclasses.replace(sbatch.request(spec), job_name="")
        if got != want:
            diff = [f"{f.name} {getattr(got, f.name)} (member 0: {getattr(want, f.name)})"
                    for f in dataclasses.fields(got) if getattr(got, f.name) != getattr(want, f.name)]
            raise _refuse(member, f"asks Slurm for another allocation than member 0: {', '.join(diff)}. The members "
                          "of one job array share one batch script: sweep resources in separate sweeps", "resources")


def check_halving(specs: list[RunSpec], manifest: Manifest) -> None:
    """Successive halving compares the members at rung steps by a metric the trl job logs at those steps: a training
    key every step, an eval_* key only where the member validates (train.early_stop, every train.test_freq steps)."""
    if not manifest.rungs:
        return
    if manifest.eta < 2:
        raise SpecError(f"--eta {manifest.eta}: at least 2 (a rung keeps the top 1/eta)", key="--eta")
    for spec, member in zip(specs, manifest.members):
        t = spec.recipe.train
        if not traits_of(spec.recipe.engine).stops_between_steps:
            raise _refuse(member, f"is a {spec.recipe.engine} run: successive halving stops trl members only (verl has "
                          "no hook to save and stop between its steps)", "--rungs")
        if any(r < 1 or (t.total_training_steps and r >= t.total_training_steps) for r in manifest.rungs):
            raise _refuse(member, f"trains {t.total_training_steps} steps: every rung ({manifest.rungs}) must be a step "
                          "before its last", "--rungs")
        if manifest.metric.startswith("eval_") and (t.early_stop is None or t.test_freq <= 0
                                                    or any(r % t.test_freq for r in manifest.rungs)):
            raise _refuse(member, f"does not validate at every rung ({manifest.rungs}): {manifest.metric} is a "
                          "validation's metric; set train.test_freq dividing the rungs and train.early_stop (a large "
                          "patience stops by halving only), or rank by a training metric (--metric reward)", "--rungs")


def plan_sweep(recipe: str, cluster: str, overrides: list[str], name: str | None, random_k: int | None, seed: int,
               parallel: int, schema: bool = True, metric: str = "reward", mode: str = "max",
               rungs: list[int] | None = None, eta: int = 2) -> SweepPlan:
    """Expand, resolve and plan every member; SpecError (exit 2) naming the first member that fails and why."""
    from hpc_grpo.planning.plan import run_plan

    if parallel < 1:
        raise SpecError(f"--parallel {parallel}: at least 1 member must run at a time", key="--parallel")
    if mode not in ("max", "min"):
        raise SpecError(f"--mode {mode!r}: max or min", key="--mode")
    grid = split_axes(overrides)
    combos = grid_members(grid, random_k, seed)
    sweep = check_name(name, "sweep") if name else default_name(recipe)
    members = [Member(i, layout.member_name(sweep, i), combo) for i, combo in enumerate(combos)]
    how = "grid" if random_k is None else f"random {random_k} of {grid.size} (seed {seed})"
    manifest = Manifest(sweep, recipe, cluster, grid.base, dict(grid.axes), members, parallel, how,
                        metric=metric, mode=mode, rungs=sorted(set(rungs or [])), eta=eta)
    notes: list[str] = []
    specs: list[RunSpec] = []
    folder = Path()
    for member in members:
        spec = resolve_member(recipe, cluster, grid.base, member, None, notes, sweep)
        folder = spec.cluster.runs_root_path() / sweep
        specs.append(spec.model_copy(update={"run_dir": str(layout.member_dir(folder, sweep, member.index))}))
    if layout.sweep_file(folder).exists() or any(layout.spec_file(s.path).exists() for s in specs):
        raise SpecError(f"a sweep named {sweep} already exists at {folder}: `hpc-grpo sweep status {sweep}`, "
                        "`hpc-grpo resume " + sweep + "`, or give another --name", key="--name")
    check_alike(specs, manifest)
    check_halving(specs, manifest)
    plans = []
    for member, spec in zip(members, specs):
        result = run_plan(spec, schema=schema, for_submit=True)
        if not result.ok:
            errors = "; ".join(str(f) for f in result.findings if f.severity.value == "error")
            raise _refuse(member, f"fails its plan: {errors}", "sweep")
        plans.append(result)
    recreate = ["hpc-grpo", "sweep", f"recipe={recipe}", f"cluster={cluster}", *overrides, f"--name={sweep}",
                f"--parallel={parallel}", *([f"--random={random_k}", f"--seed={seed}"] if random_k else []),
                f"--metric={metric}", f"--mode={mode}",
                *([f"--rungs={','.join(map(str, manifest.rungs))}", f"--eta={eta}"] if manifest.rungs else [])]
    return SweepPlan(folder, manifest, [p.spec for p in plans], plans, recreate, notes)


def submit_sweep(plan: SweepPlan) -> list[Any]:
    """Write the manifest and the members' run directories, queue the one array (and each member's eval job)."""
    from hpc_grpo.launch.render import render_all
    from hpc_grpo.launch.submit import submit_sweep_array

    sweeps.write_manifest(plan.folder, plan.manifest)
    subs = submit_sweep_array(plan.specs, [render_all(s) for s in plan.specs], plan.indices, plan.folder,
                              plan.manifest.name, plan.manifest.parallel, plan.recreate)
    array_id = subs[0].job_id.split("_", 1)[0]
    sweeps.record_array(plan.folder, array_id, plan.indices, "train", time.strftime("%Y-%m-%dT%H:%M:%S%z"))
    return subs


# ------------------------------------------------------------------------------------------------ find
def locate_sweep(name: str) -> Path:
    """A sweep's folder from its path or its name under any runs root; SpecError naming both ways otherwise."""
    found = sweeps.find_sweep(name, runs_roots())
    if found is None:
        raise SpecError(f"no sweep {name!r}: give a sweep's folder (the one holding {layout.SWEEP_FILE}) or its name "
                        f"under {', '.join(map(str, runs_roots()))}", key="sweep")
    return found


def is_sweep(name: str | None) -> bool:
    return bool(name) and sweeps.find_sweep(str(name), runs_roots()) is not None


# ------------------------------------------------------------------------------------------------ status
@dataclass
class MemberRow:
    index: int
    name: str
    overrides: list[str]
    state: str  # the newest training job's Slurm state, or "not submitted"
    job_id: str | None
    step: int | None
    best: float | None  # the manifest's metric, best over the logged steps (mode)
    best_step: int | None
    stopped: str  # why it stopped, or "" while it runs / waits
    run_dir: str

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def best_metric(run_dir: Path, engine: str, metric: str, mode: str) -> tuple[float | None, int | None]:
    """(best value, its step) of `metric` (an engine key, or eval/...) over the run's logged steps."""
    values = [(row[metric], step) for step, row in engine_metrics.logged_metrics(run_dir, engine).items()
              if metric in row]
    if not values:
        return None, None
    value, step = (max if mode == "max" else min)(values, key=lambda v: v[0])
    return value, step


def member_row(folder: Path, manifest: Manifest, member: Member) -> MemberRow:
    run_dir = manifest.member_dir(folder, member)
    if not layout.spec_file(run_dir).is_file():
        return MemberRow(member.index, member.name, member.overrides, "not submitted", None, None, None, None, "",
                         str(run_dir))
    st = run_status(run_dir)
    train = [j for j in st.jobs if j.purpose != "eval"]
    last = train[-1] if train else None
    best, best_step = best_metric(run_dir, st.spec.recipe.engine, manifest.metric, manifest.mode)
    events = [e for e in runs.read_history(run_dir) if e.purpose in ("failed", "stopped")]
    if st.trained:
        stopped = st.trained
    elif events:
        stopped = events[-1].note
    elif last is not None and not runs.live_jobs(run_dir):
        stopped = f"job {last.job_id} ended {last.state}, not trained: `hpc-grpo resume {manifest.name}`"
    else:
        stopped = ""
    return MemberRow(member.index, member.name, member.overrides, last.state if last else "not submitted",
                     last.job_id if last else None, st.last_step, best, best_step, stopped, str(run_dir))


def sweep_status(folder: Path) -> tuple[Manifest, list[MemberRow]]:
    manifest = sweeps.read_manifest(folder)
    return manifest, [member_row(folder, manifest, m) for m in manifest.members]


# ------------------------------------------------------------------------------------------------ resume
@dataclass
class SweepResume:
    folder: Path
    manifest: Manifest
    plans: list[ResumePlan]  # the members that resume, in index order
    members: list[Member]
    skipped: list[tuple[Member, str]]  # members left as they are, and why


def plan_sweep_resume(folder: Path, items: list[str], force: bool) -> SweepResume:
    """The members that did not finish and have no live job, each planned as `resume RUN` plans it."""
    manifest = sweeps.read_manifest(folder)
    plans: list[ResumePlan] = []
    chosen: list[Member] = []
    skipped: list[tuple[Member, str]] = []
    for member in manifest.members:
        run_dir = manifest.member_dir(folder, member)
        if not layout.spec_file(run_dir).is_file():
            skipped.append((member, "never submitted"))
            continue
        live = runs.live_jobs(run_dir)
        if live:
            skipped.append((member, "has a live job: " + ", ".join(f"{j} ({s})" for j, s in live.items())))
            continue
        plan = plan_resume(run_dir, items, force)
        verdict = trained.decide(plan.spec)
        if verdict.trained and not force:
            skipped.append((member, f"trained ({verdict.reason})"))
            continue
        halted = [e for e in runs.read_history(run_dir) if e.purpose == "stopped" and e.data.get("halving")]
        if halted and not force:
            skipped.append((member, f"{halted[-1].note} (--force resumes it)"))
            continue
        plans.append(plan)
        chosen.append(member)
    return SweepResume(folder, manifest, plans, chosen, skipped)


def check_sweep_resume(resume: SweepResume) -> None:
    """Each resubmission planned again (as `resume RUN` does); SpecError naming the first member that fails."""
    for member, plan in zip(resume.members, resume.plans):
        result = check_plan(plan)
        if not result.ok:
            errors = "; ".join(str(f) for f in result.findings if f.severity.value == "error")
            raise _refuse(member, f"fails its plan: {errors}")
    if resume.plans:
        check_alike([p.spec for p in resume.plans], dataclasses.replace(resume.manifest, members=resume.members))


def submit_sweep_resume(resume: SweepResume) -> list[Any]:
    """The unfinished members as one new job array (same indices, same %P), purpose "resume"."""
    from hpc_grpo.launch.render import render_all
    from hpc_grpo.launch.submit import submit_sweep_array

    specs = [p.spec for p in resume.plans]
    indices = [m.index for m in resume.members]
    recreate = ["hpc-grpo", "resume", resume.manifest.name]
    subs = submit_sweep_array(specs, [render_all(s) for s in specs], indices, resume.folder, resume.manifest.name,
                              resume.manifest.parallel, recreate, purpose="resume",
                              notes=[p.note() for p in resume.plans])
    sweeps.record_array(resume.folder, subs[0].job_id.split("_", 1)[0], indices, "resume",
                        time.strftime("%Y-%m-%dT%H:%M:%S%z"))
    return subs
