"""What a run is doing: its job chain with live Slurm state, training progress, checkpoints, logs.

Everything comes from the run directory and Slurm, so it works from any login node.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hpc_grpo.cluster import states
from hpc_grpo.runstate import checkpoints as ck
from hpc_grpo.config import registry
from hpc_grpo.runstate import layout, runs, trained
from hpc_grpo.runstate import metrics as engine_metrics
from hpc_grpo.runstate.health import run_health
from hpc_grpo.config.resolve import load_frozen, load_raw
from hpc_grpo.config.cluster import Cluster
from hpc_grpo.config.spec import RunSpec
from hpc_grpo.common.yamlio import SpecError
from hpc_grpo.engines import sync_break


def runs_roots() -> list[Path]:
    """The runs root of every known cluster profile (a run is found wherever it was made)."""
    roots = []
    for name in registry.list_names("clusters"):
        try:
            data, _ = load_raw("clusters", name)
            data.setdefault("name", name)
            roots.append(Cluster.model_validate(data).runs_root_path())
        except (SpecError, ValueError):
            continue
    return list(dict.fromkeys(roots))


def locate_run(run: str | None) -> Path:
    """The one way every command finds the run it is given: its folder (a path), its name under any runs root, or
    the newest run when none is given. Run names hold no '/', so anything with one is a folder."""
    if run:
        folder = Path(run).expanduser()
        if layout.spec_file(folder).is_file():
            return folder.resolve()
        sweep = folder if layout.sweep_file(folder).is_file() else next(
            (r / run for r in runs_roots() if "/" not in run and layout.sweep_file(r / run).is_file()), None)
        if sweep is not None:
            raise SpecError(f"{run!r} is a sweep ({sweep}), not a run: `hpc-grpo sweep status {run}` shows its members, "
                            f"each a run in {sweep}", key="run")
        if "/" in run or run.startswith(("~", ".")):
            why = "does not exist" if not folder.exists() else f"has no {layout.SPEC_FILE}, so it is not a run folder"
            raise SpecError(f"{run!r} {why}: give a run's folder (the one holding its {layout.SPEC_FILE}) or its name; "
                            "`hpc-grpo runs` lists both", key="run")
    found = runs.find_runs(runs_roots())
    if run is None:
        if not found:
            raise SpecError("no runs found under " + ", ".join(map(str, runs_roots())), key="run")
        return found[0]
    for path in found:
        if path.name == run:
            return path
    raise SpecError(f"no run named {run!r} under {', '.join(map(str, runs_roots()))}: give its folder or its name "
                    "(`hpc-grpo runs` lists both)", key="run")


@dataclass
class JobRow:
    job_id: str
    purpose: str
    submitted: str
    state: str
    elapsed_s: int | None
    exit_code: str
    nodes: str


@dataclass
class Restart:
    """One restart of a job: the allocation that ended, why, and where the next start resumed."""

    job_id: str
    attempt: int  # the start that followed (1 = first restart)
    ended: str
    cause: str  # "time limit", "preemption", "requeue (scontrol requeue: SIGTERM, no save)", "node failure", ...
    resumed_step: int | None
    detail: str = ""


@dataclass
class RunStatus:
    spec: RunSpec
    jobs: list[JobRow] = field(default_factory=list)
    restarts: list[Restart] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)  # "failed" events: why a job stopped (disk full, ...)
    last_step: int | None = None
    newest_checkpoint: str | None = None
    complete_checkpoints: int = 0
    logs: list[str] = field(default_factory=list)
    trained: str | None = None  # "trained (...)" once the run is trained (train_done.json or its final checkpoint)
    health: list[str] = field(default_factory=list)  # runstate/health's findings on the logged steps
    warnings: list[str] = field(default_factory=list)  # a test hook on here or in a job of the run (sync_break)

    @property
    def time_used_s(self) -> int:
        return sum(j.elapsed_s or 0 for j in self.jobs)

    def as_dict(self) -> dict[str, Any]:
        return {"run": self.spec.run_name, "run_dir": self.spec.run_dir, "recipe": self.spec.recipe.name,
                "cluster": self.spec.cluster.name, "jobs": [j.__dict__ for j in self.jobs],
                "last_step": self.last_step, "newest_checkpoint": self.newest_checkpoint,
                "complete_checkpoints": self.complete_checkpoints, "time_used_s": self.time_used_s, "logs": self.logs,
                "restarts": [r.__dict__ for r in self.restarts], "failures": self.failures,
                "trained": self.trained, "health": self.health, "warnings": self.warnings, "accepted": [a.model_dump() for a in self.spec.accepted]}


def checkpoints(spec: RunSpec) -> list[ck.Checkpoint]:
    return ck.list_checkpoints(spec.path, spec.recipe.engine)


def last_step(spec: RunSpec) -> int | None:
    """The last step the engine logged (metrics.jsonl, either engine's layout) or saved (verl: its tracker file)."""
    steps = engine_metrics.read_raw(layout.metrics_file(spec.path))
    return max(steps) if steps else ck.tracker_step(spec.path)


def run_status(run_dir: Path) -> RunStatus:
    spec = load_frozen(layout.spec_file(run_dir))
    history = runs.read_history(run_dir)
    events = [e for e in history if e.purpose in runs.EVENTS]
    history = [e for e in history if e.purpose not in runs.EVENTS]
    slurm_ids = list(dict.fromkeys(e.job_id for e in history if e.executor == "slurm"))
    infos: dict[str, Any] = {}
    attempts: dict[str, list[Any]] = {}
    if slurm_ids:
        from hpc_grpo.cluster import slurm

        infos = slurm.job_states(slurm_ids)
        try:
            attempts = slurm.job_attempts(slurm_ids)
        except slurm.SlurmError:
            attempts = {}
    status = RunStatus(spec=spec)
    seen: set[str] = set()
    for entry in history:
        if entry.job_id in seen:
            continue  # a requeue line of a job already shown: its restarts are listed below
        seen.add(entry.job_id)
        info = infos.get(entry.job_id)
        if entry.executor == "local":
            live = bool(runs.live_jobs(run_dir).get(entry.job_id))
            state = "RUNNING" if live else _local_state(spec, entry.job_id)
            status.jobs.append(JobRow(entry.job_id, entry.purpose, entry.time, state,
                                      _local_elapsed_s(spec, entry, live), "", "local"))
        else:
            spent = [a.info.elapsed_s for a in attempts.get(entry.job_id, [])]
            elapsed = sum(x or 0 for x in spent) if spent else (info.elapsed_s if info else None)
            status.jobs.append(JobRow(entry.job_id, entry.purpose, entry.time, info.state if info else "UNKNOWN",
                                      elapsed, info.exit_code if info else "", info.nodelist if info else ""))
        status.logs.append(str(layout.job_log(spec.path, entry.job_id)))
    status.restarts = restarts(history, events, attempts)
    status.failures = [f"job {e.job_id}: {e.note}" for e in events if e.purpose in ("failed", "skipped")]
    ckpts = checkpoints(spec)
    complete = [c for c in ckpts if c.complete]
    status.complete_checkpoints = len(complete)
    status.newest_checkpoint = str(complete[-1].path) if complete else None
    status.last_step = last_step(spec)
    status.trained = trained_line(trained.decide(spec), status.jobs, events)
    status.health = [h.message for h in run_health(engine_metrics.run_metrics(spec.path).rows)]
    status.warnings = test_hook_warnings(events)
    return status


def test_hook_warnings(events: list[runs.HistoryEntry]) -> list[str]:
    """The weight-sync break (engines/sync_break), loudly: on in this shell, or on in a job of the run."""
    out = [f"in this shell: {sync_break.warning()}"] if sync_break.enabled() else []
    jobs = list(dict.fromkeys(e.job_id for e in events if e.purpose == "start" and e.data.get("test_hook")))
    if jobs:
        out.append(f"job(s) {', '.join(jobs)} ran with {sync_break.ENV}=1: the weight sync was broken on purpose "
                   "(a test run; its findings and numbers say nothing of a real run)")
    return out


def job_succeeded(run_dir: Path, job_id: str, fallback_state: str | None = None) -> bool:
    """Whether a job of the run ended well, by the run's own row for it (Slurm's state, or the local job's), not
    submitit's: a local job that raised is "FINISHED" to submitit. `fallback_state` when the run has no row for it."""
    rows = [j for j in run_status(run_dir).jobs if j.job_id == str(job_id)]
    return rows[-1].state == "COMPLETED" if rows else fallback_state == "COMPLETED"


def trained_line(verdict: trained.Trained, jobs: list[JobRow], events: list[runs.HistoryEntry]) -> str | None:
    """What status says of a trained run; for one trained by its final checkpoint whose training job then failed
    (W&B's teardown, say), that it counts as trained and how the job ended. None while not trained."""
    if not verdict.trained:
        return None
    if not verdict.by_checkpoint:
        return f"trained ({verdict.reason})"
    line = f"final checkpoint step {verdict.step} written"
    train = [j for j in jobs if j.purpose != "eval"]
    last = train[-1] if train else None
    if last is not None and last.state not in ("COMPLETED", "RUNNING", "PENDING", "UNKNOWN"):
        said = [e.note for e in events if e.purpose == "failed" and e.job_id == last.job_id]
        why = said[-1] if said else f"job {last.job_id} ended {last.state}" + (f", exit {last.exit_code}"
                                                                              if last.exit_code else "")
        line += f"; the job then failed: {why}"
    return f"trained ({line})"


def restarts(history: list[runs.HistoryEntry], events: list[runs.HistoryEntry],
             attempts: dict[str, list[Any]]) -> list[Restart]:
    """Each restart of each job with its cause: Slurm's state for the allocation that ended (sacct -D), made
    precise by the job's own requeue line (written by its USR2 handler, which knows time limit from
    preemption), and the step the next start resumed from (its "start" event)."""
    out: list[Restart] = []
    for job_id, allocs in attempts.items():
        notes = [e for e in history if e.job_id == job_id and e.purpose == "requeue"]
        starts = {int(e.data.get("restart_count", 0)): e for e in events if e.job_id == job_id and e.purpose == "start"}
        for k, alloc in enumerate(allocs[:-1]):
            state = alloc.info.state
            cause = states.RESTART_CAUSES.get(state, state.lower())
            note = next((n.note for n in notes if _within(n.time, alloc.start, alloc.end)), "")
            if state == "REQUEUED":
                low = note.lower()
                if "preempt" in low:
                    cause = states.PREEMPTION
                elif states.TIME_LIMIT in low or "timeout" in low:
                    cause = states.TIME_LIMIT
                elif note:
                    cause = "requeue on a signal"
                else:
                    cause = "requeue (scontrol requeue: SIGTERM, no save)"
            nxt = starts.get(k + 1)
            step = nxt.data.get("step") if nxt else None
            out.append(Restart(job_id, k + 1, alloc.end, cause, step if isinstance(step, int) else None, note))
    return out


def _parse_time(text: str) -> float | None:
    """History times ("%Y-%m-%dT%H:%M:%S%z") and sacct's ("%Y-%m-%dT%H:%M:%S", local) as epoch seconds."""
    import time as _t

    for fmt in ("%Y-%m-%dT%H:%M:%S%z", "%Y-%m-%dT%H:%M:%S"):
        try:
            parsed = _t.strptime(text, fmt)
        except ValueError:
            continue
        if fmt.endswith("%z"):
            import calendar

            return calendar.timegm(parsed) - (parsed.tm_gmtoff or 0)
        return _t.mktime(parsed)
    return None


def _within(when: str, start: str, end: str, slack_s: float = 60.0) -> bool:
    t, a, b = _parse_time(when), _parse_time(start), _parse_time(end)
    return t is not None and a is not None and b is not None and a - slack_s <= t <= b + slack_s


def _local_elapsed_s(spec: RunSpec, entry: runs.HistoryEntry, live: bool) -> int | None:
    """A local job's wall time: from its submission to submitit's result file (or now, while it runs)."""
    import time as _t

    start = _parse_time(entry.time)
    if start is None:
        return None
    end: float | None = _t.time() if live else None
    for path in (layout.job_result(spec.path, entry.job_id), layout.job_log(spec.path, entry.job_id)):
        if end is None and path.is_file():
            end = path.stat().st_mtime
    return max(0, round(end - start)) if end is not None else None


def _local_state(spec: RunSpec, job_id: str) -> str:
    """A finished local job: submitit's result pickle holds ("success", value) or ("error", traceback)."""
    import pickle

    result = layout.job_result(spec.path, job_id)
    if not result.is_file():
        return "UNKNOWN"
    with open(result, "rb") as handle:  # written by our own job in our own run directory
        outcome = pickle.load(handle)[0]
    return "COMPLETED" if outcome == "success" else "FAILED"
