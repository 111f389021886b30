"""What a run is doing: its job chain with live Slurm state, training progress, checkpoints, logs.

Everything comes from the run directory and Slurm, so it works from any login node.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hpc_grpo import checkpoints as ck
from hpc_grpo import registry, render, runs
from hpc_grpo.resolve import load_frozen, load_raw
from hpc_grpo.spec import Cluster, RunSpec
from hpc_grpo.yamlio import SpecError


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
    """A run by path, by name under any runs root, or the newest run when none is given."""
    if run and Path(run).expanduser().joinpath(runs.SPEC).is_file():
        return Path(run).expanduser().resolve()
    found = runs.find_runs(runs_roots())
    if run is None:
        if not found:
            raise SpecError("no runs found under " + ", ".join(map(str, runs_roots())), key="run")
        return found[0]
    for path in found:
        if path.name == run:
            return path
    raise SpecError(f"no run named {run!r} under {', '.join(map(str, runs_roots()))}", key="run")


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
class RunStatus:
    spec: RunSpec
    jobs: list[JobRow] = field(default_factory=list)
    last_step: int | None = None
    newest_checkpoint: str | None = None
    complete_checkpoints: int = 0
    logs: list[str] = field(default_factory=list)

    @property
    def time_used_s(self) -> int:
        return sum(j.elapsed_s or 0 for j in self.jobs)

    def as_dict(self) -> dict[str, Any]:
        return {"run": self.spec.run_name, "run_dir": self.spec.run_dir, "recipe": self.spec.recipe.name,
                "cluster": self.spec.cluster.name, "jobs": [j.__dict__ for j in self.jobs],
                "last_step": self.last_step, "newest_checkpoint": self.newest_checkpoint,
                "complete_checkpoints": self.complete_checkpoints, "time_used_s": self.time_used_s, "logs": self.logs}


def checkpoints(spec: RunSpec) -> list[ck.Checkpoint]:
    return ck.list_checkpoints(spec.path, spec.recipe.engine)


def last_step(spec: RunSpec) -> int | None:
    """The last step the engine logged (trl: metrics.jsonl) or saved (verl: its tracker file)."""
    metrics = spec.path / "metrics.jsonl"
    if metrics.is_file():
        lines = [ln for ln in metrics.read_text().splitlines() if ln.strip()]
        if lines:
            try:
                return int(json.loads(lines[-1]).get("step"))
            except (ValueError, TypeError):
                pass
    return ck.tracker_step(spec.path)


def run_status(run_dir: Path) -> RunStatus:
    spec = load_frozen(run_dir / runs.SPEC)
    history = runs.read_history(run_dir)
    slurm_ids = [e.job_id for e in history if e.executor == "slurm"]
    infos: dict[str, Any] = {}
    if slurm_ids:
        from hpc_grpo import slurm

        infos = slurm.job_states(list(dict.fromkeys(slurm_ids)))
    status = RunStatus(spec=spec)
    seen: set[str] = set()
    for entry in history:
        if entry.job_id in seen and entry.purpose == "requeue":
            continue
        seen.add(entry.job_id)
        info = infos.get(entry.job_id)
        if entry.executor == "local":
            state = "RUNNING" if runs.live_jobs(run_dir).get(entry.job_id) else _local_state(spec, entry.job_id)
            status.jobs.append(JobRow(entry.job_id, entry.purpose, entry.time, state, None, "", "local"))
        else:
            status.jobs.append(JobRow(entry.job_id, entry.purpose, entry.time, info.state if info else "UNKNOWN",
                                      info.elapsed_s if info else None, info.exit_code if info else "",
                                      info.nodelist if info else ""))
        status.logs.append(str(render.submitit_dir(spec) / f"{entry.job_id}_0_log.out"))
    ckpts = checkpoints(spec)
    complete = [c for c in ckpts if c.complete]
    status.complete_checkpoints = len(complete)
    status.newest_checkpoint = str(complete[-1].path) if complete else None
    status.last_step = last_step(spec)
    return status


def _local_state(spec: RunSpec, job_id: str) -> str:
    """A finished local job: submitit's result pickle holds ("success", value) or ("error", traceback)."""
    import pickle

    result = render.submitit_dir(spec) / f"{job_id}_0_result.pkl"
    if not result.is_file():
        return "UNKNOWN"
    with open(result, "rb") as handle:  # written by our own job in our own run directory
        outcome = pickle.load(handle)[0]
    return "COMPLETED" if outcome == "success" else "FAILED"
