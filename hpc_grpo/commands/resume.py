"""`hpc-grpo resume [RUN] [key=value ...] [--force]`: resubmit a run from its frozen spec.

The frozen spec.yaml is the run: resume never re-reads the recipe, so a recipe edited since cannot change
a run halfway. Only resources and time limits may change (a bigger allocation, a longer limit); anything
else would make the rest of the run train something other than its first part, so it needs --force. Where
training goes on from is decided in the job (hpc_grpo.job.prepare_resume); this module only says what the
job will find, refuses while a job of the run is alive or when the job could not load its checkpoint (a verl
FSDP checkpoint at another world size: hpc_grpo.planning.world_size, which the job applies again), and records
the request in the history.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hpc_grpo.runstate import checkpoints as ck
from hpc_grpo.runstate import layout, runs
from hpc_grpo.config.secrets import redact, secret_error, secret_in
from hpc_grpo.config.spec import RunSpec
from hpc_grpo.planning.world_size import check_world_size
from hpc_grpo.common.yamlio import SpecError, parse_scalar

# What may change without --force: where and how long the run is allowed to run, not what it trains.
FREE_PREFIXES = ("resources.",)
FREE_KEYS = ("cluster.time_max", "cluster.signal_delay_s", "cluster.partition", "cluster.account", "cluster.qos")


@dataclass
class ResumePlan:
    """What `resume` is about to do, for the CLI to print (and the history to keep)."""

    spec: RunSpec
    checkpoint: ck.Checkpoint | None
    newer_incomplete: list[ck.Checkpoint] = field(default_factory=list)
    overrides: list[str] = field(default_factory=list)
    forced: list[str] = field(default_factory=list)  # overrides only --force allowed
    finished: dict[str, Any] | None = None  # train_done.json when the run had finished

    @property
    def step(self) -> int:
        return self.checkpoint.step if self.checkpoint else 0

    def from_text(self) -> str:
        if self.checkpoint is None:
            return "no complete checkpoint: the job starts from step 0"
        return f"resumes from {self.checkpoint.path} (step {self.step})"

    def nothing_to_do(self, force: bool) -> bool:
        """A finished run is resubmitted only with --force (e.g. with more training steps)."""
        return self.finished is not None and not force

    def describe(self, force: bool) -> list[str]:
        """What the CLI prints before it submits (or instead, for a finished run without --force)."""
        lines = [f"Run {self.spec.run_name}: {self.spec.run_dir}"]
        if self.finished is not None and not force:  # nothing_to_do, spelled out for the type checker
            step = self.finished.get("final_step")
            lines.append(f"Run {self.spec.run_name} finished ({layout.DONE_FILE}: step {step}): "
                         "nothing to resume. Use --force to resubmit it anyway (e.g. with more training steps).")
            return lines
        lines.append(f"It {self.from_text()}.")
        for c in self.newer_incomplete:
            lines.append(f"At job start, {c.path.name} moves to {layout.quarantine_dir(self.spec.path)} ({c.reason}).")
        if self.forced:
            lines.append(f"Forced overrides: {' '.join(self.forced)}")
        return lines

    def note(self) -> str:
        parts = [self.from_text()]
        if self.overrides:
            parts.append("overrides " + " ".join(self.overrides))
        if self.forced:
            parts.append("forced " + " ".join(self.forced))
        return "; ".join(parts)


def _bad(key: str, value: str, rule: str, fix: str) -> SpecError:
    return SpecError(f"{value!r} is refused: {rule}. {fix}", key=key)


def check_override(item: str, force: bool) -> tuple[str, Any, bool]:
    """(key, value, forced) for one `key=value`; SpecError naming key, value, rule and fix when refused."""
    if "=" not in item or not item.split("=", 1)[0].strip():
        raise _bad(item, item, "an override is key=value", "example: resources.time=02:00:00")
    key, raw = item.split("=", 1)
    key = key.strip()
    secret = secret_in(key, parse_scalar(raw))
    if secret:
        raise secret_error(secret)
    free = key.startswith(FREE_PREFIXES) or key in FREE_KEYS
    if not free and not force:
        raise _bad(key, raw, "resume changes only resources.* and time limits (" + ", ".join(FREE_KEYS)
                   + "); anything else would train the rest of the run differently from its start",
                   f"submit a new run, or pass --force to resume with {key}={raw} anyway")
    if key in ("run_dir", "run_name", "version", "created") or key.startswith(("recipe.", "run_")):
        raise _bad(key, raw, "the run's name and place cannot change", "use a recipe key (e.g. resources.time) or submit a new run")
    return key, parse_scalar(raw), not free


def apply_overrides(spec: RunSpec, items: list[str], force: bool) -> tuple[RunSpec, list[str]]:
    """The frozen spec with the overrides applied and validated again (same rules as submit)."""
    from hpc_grpo.config.resolve import _set_dotted

    data = spec.model_dump(mode="json")
    forced: list[str] = []
    for item in items:
        key, value, is_forced = check_override(item, force)
        target = key.removeprefix("cluster.") if key.startswith("cluster.") else key
        section = data["cluster"] if key.startswith("cluster.") else data["recipe"]
        if key.startswith("passthrough."):
            section.setdefault("passthrough", {})[key.removeprefix("passthrough.")] = value
        else:
            _set_dotted(section, target, value, "hpc-grpo resume")
        if is_forced:
            forced.append(item)
    data["overrides"] = [*data.get("overrides", []), *items]
    try:
        return RunSpec.model_validate(data), forced
    except ValueError as exc:
        from pydantic import ValidationError

        if isinstance(exc, ValidationError):
            err = exc.errors()[0]
            loc = ".".join(str(p) for p in err["loc"][1:]) if err["loc"] else ""
            raise SpecError(f"{err['msg']} (value {redact(err.get('input'))!r}); fix the override", key=loc) from None
        raise


def plan_resume(run_dir: Path, items: list[str], force: bool) -> ResumePlan:
    """Everything resume checks before it submits; raises SpecError (exit 2) or runs.RunBusy."""
    from hpc_grpo.config.resolve import load_frozen

    frozen = load_frozen(layout.spec_file(run_dir))
    runs.refuse_if_live(run_dir)
    spec, forced = apply_overrides(frozen, items, force)
    ckpts = ck.list_checkpoints(run_dir, spec.recipe.engine)
    best = ck.newest_complete(ckpts)
    newer = [c for c in ckpts if not c.complete and c.step > (best.step if best else -1)]
    finished = None
    done = layout.done_file(run_dir)
    if done.is_file():
        try:
            finished = json.loads(done.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            finished = {"final_step": None}
    if finished is None or force:  # a finished run without --force is not resubmitted: nothing to refuse
        check_world_size(spec, best, before=frozen)
    return ResumePlan(spec, best, newer, list(items), forced, finished)


def check_plan(plan: ResumePlan) -> Any:
    """The resubmission planned again, as submit plans (schema aside: it was checked at submit): the overrides may
    not fit the cluster any more. The CLI prints its findings and submits nothing unless it is ok."""
    from hpc_grpo.planning.plan import run_plan

    return run_plan(plan.spec, schema=False, for_submit=True)


def submit_resume(plan: ResumePlan) -> Any:
    """Render from the (overridden) frozen spec and submit with purpose "resume"; the history line says
    from which step, with which overrides."""
    from hpc_grpo.launch.render import render_all
    from hpc_grpo.launch.submit import submit_run

    data = {"resume_step": plan.step, "checkpoint": str(plan.checkpoint.path) if plan.checkpoint else None,
            "overrides": plan.overrides, "forced": plan.forced}
    return submit_run(plan.spec, render_all(plan.spec), purpose="resume", note=plan.note(), data=data)
