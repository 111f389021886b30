"""The hpc-grpo command line: parse, call the library, print.

Arguments are `recipe=NAME cluster=NAME key=value ...` so a command line reads like the recipe
it changes. Heavy modules (torch, trl, lm_eval, submitit's executors) are imported only inside
the commands that need them: plan/render/status must answer instantly on a login node.
Exit codes: 0 ok, 1 an error finding or a failed job, 2 invalid input.
"""

from __future__ import annotations

import json
import os
import sys

# hpc-grpo uses no pydantic plugin; without this, pydantic scans every installed distribution's entry points for
# one, which costs ~60 ms of every command in a venv with a training stack. An explicit user setting wins.
os.environ.setdefault("PYDANTIC_DISABLE_PLUGINS", "__all__")
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from hpc_grpo.config import registry
from hpc_grpo.common.findings import Finding, Severity
from hpc_grpo.common.yamlio import SpecError
from hpc_grpo.runstate import layout

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="Validated, rendered and resumable GRPO post-training jobs (verl, trl) on Slurm clusters.",
    rich_markup_mode=None,
)
data_app = typer.Typer(help="Prepare training and evaluation data.", no_args_is_help=True)
model_app = typer.Typer(help="Build local models for machines without the Hugging Face Hub.", no_args_is_help=True)
app.add_typer(data_app, name="data")
app.add_typer(model_app, name="model")

class _LazyConsole:
    """rich costs ~50 ms to import: load it on first print, so `--json` and errors stay fast."""

    def __init__(self, stderr: bool) -> None:
        self._stderr = stderr
        self._console: Any = None

    def __getattr__(self, name: str) -> Any:
        if self._console is None:
            from rich.console import Console

            self._console = Console(stderr=self._stderr, highlight=False, soft_wrap=True)
        return getattr(self._console, name)


def Table(*args: Any, **kwargs: Any) -> Any:  # noqa: N802 - stands in for rich.table.Table
    from rich.table import Table as RichTable

    return RichTable(*args, **kwargs)


def print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2) + "\n")


out: Any = _LazyConsole(stderr=False)
err: Any = _LazyConsole(stderr=True)

ArgsT = Annotated[Optional[list[str]], typer.Argument(help="recipe=NAME [cluster=NAME] [key=value ...]", show_default=False)]
JsonT = Annotated[bool, typer.Option("--json", help="machine-readable output")]
NameT = Annotated[Optional[str], typer.Option("--name", help="run name (default: recipe name + timestamp)")]
SchemaT = Annotated[bool, typer.Option("--schema/--no-schema", help="compose against verl's real config if installed")]


def parse_args(args: list[str] | None) -> tuple[str, str | None, list[str]]:
    recipe: str | None = None
    cluster: str | None = None
    rest: list[str] = []
    for item in args or []:
        if item.startswith("recipe="):
            recipe = item.split("=", 1)[1]
        elif item.startswith("cluster="):
            cluster = item.split("=", 1)[1]
        else:
            rest.append(item)
    if not recipe:
        raise SpecError(f"no recipe given: add recipe=NAME (known: {', '.join(registry.list_names('recipes'))})", key="recipe")
    return recipe, cluster, rest


def _resolve(args: list[str] | None, name: str | None):
    from hpc_grpo.config.clusterpick import choose_cluster
    from hpc_grpo.config.resolve import resolve_spec

    recipe, cluster, overrides = parse_args(args)
    choice = choose_cluster(cluster)
    err.print(f"cluster: {choice.name} ({choice.why})")
    return resolve_spec(recipe, choice.name, overrides, run_name=name)


# ------------------------------------------------------------------------------------- printing
_STYLE = {Severity.ERROR: "bold red", Severity.WARNING: "yellow", Severity.INFO: "dim"}


def print_findings(findings: list[Finding], console: Any = out) -> None:
    """A table on a terminal; one whole line per finding in pipes and CI logs (a table would fold key
    names at 80 columns there, and grep could no longer find them)."""
    if not findings:
        console.print("No findings.")
        return
    order = {Severity.ERROR: 0, Severity.WARNING: 1, Severity.INFO: 2}
    ordered = sorted(findings, key=lambda f: order[f.severity])
    if not console.is_terminal:
        console.file.write("Findings:\n" + "".join(f"  {f}\n" for f in ordered))
        console.file.flush()
        return
    t = Table(title="Findings", show_lines=False)
    for col in ("severity", "key", "message", "fix"):
        t.add_column(col, overflow="fold")
    for f in ordered:
        t.add_row(f"[{_STYLE[f.severity]}]{f.severity.value}[/]", f.key, f.message, f.fix)
    console.print(t)


def print_plan(plan: Any) -> None:
    spec, lay, r = plan.spec, plan.layout, plan.spec.recipe
    out.print(f"[bold]{spec.run_name}[/]: recipe {r.name} ({r.engine}/{r.backend}) on cluster {spec.cluster.name}"
              f" -> {spec.run_dir}")
    t = Table(title="Layout")
    for col in ("nodes", "GPUs/node", "world", "TP", "PP", "CP", "EP", "DP", "rollout TP"):
        t.add_column(col, justify="right")
    t.add_row(*map(str, (r.resources.nodes, lay.gpus_per_node, lay.world_size, lay.tp, lay.pp, lay.cp, lay.ep,
                         lay.dp, lay.rollout_tp)))
    out.print(t)
    b = r.batch
    t = Table(title="Batches")
    for col in ("train (prompts)", "n", "samples/step", "mini", "micro/GPU", "dynamic bsz"):
        t.add_column(col, justify="right")
    t.add_row(str(b.train), str(r.grpo.n), str(b.train * r.grpo.n), str(b.mini), str(b.micro_per_gpu), str(b.dynamic_bsz))
    out.print(t)
    if plan.shape is not None:
        s = plan.shape
        out.print(f"Model {s.name}: {s.params / 1e9:.2f}B parameters, {s.num_attention_heads} heads, "
                  f"{s.num_key_value_heads} KV heads, {s.num_hidden_layers} layers"
                  + (f", {s.num_experts} experts" if s.num_experts else ""))
    est = plan.memory
    if est is not None:
        t = Table(title=f"Memory per GPU (rough; peak phase: {est.peak_phase})")
        t.add_column("term")
        t.add_column("GiB", justify="right")
        for term, gib in est.terms.items():
            style = "bold" if term == est.largest_term else ""
            t.add_row(f"[{style}]{term}[/]" if style else term, f"{gib:.1f}")
        t.add_row("[bold]peak[/]", f"[bold]{est.total_gib:.1f} of {est.capacity_gib:.1f}[/]")
        out.print(t)
        out.print("Phases (GiB): " + ", ".join(f"{k} {v:.1f}" for k, v in est.phase_gib().items()))
    sched = plan.schedule
    if sched is not None:
        epochs = "" if sched.steps_per_epoch is None else f" ({sched.steps_per_epoch} per epoch)"
        total = "unknown" if sched.total_steps is None else str(sched.total_steps)
        out.print(f"[bold]Schedule[/]: {total} steps{epochs}; rows: {sched.rows_source}")
        size = f"; {sched.size.describe()} each" if sched.size else "; size unknown (the model's config.json is not readable here)"
        out.print(f"  checkpoints (save_freq {sched.save_freq}) at steps {', '.join(map(str, sched.checkpoint_steps)) or 'none'}{size}")
        if sched.step_s:
            out.print(f"  ~{sched.step_s:.0f} s per step (rough, calibrated on field report 004): ~{sched.steps_in_time_limit} "
                      f"steps fit in resources.time {r.resources.time}")
    out.print(f"Engine schema: {plan.schema_checked}")
    print_findings(plan.findings)


def plan_json(plan: Any) -> dict[str, Any]:
    from dataclasses import asdict

    return {
        "run_name": plan.spec.run_name,
        "run_dir": plan.spec.run_dir,
        "ok": plan.ok,
        "layout": asdict(plan.layout),
        "memory": None if plan.memory is None else {
            "terms": plan.memory.terms, "peak_gib": plan.memory.total_gib, "capacity_gib": plan.memory.capacity_gib,
            "fits": plan.memory.fits, "largest_term": plan.memory.largest_term, "phases": plan.memory.phase_gib(),
            "peak_phase": plan.memory.peak_phase},
        "schedule": None if plan.schedule is None else plan.schedule.as_dict(),
        "schema": plan.schema_checked,
        "findings": [f.as_dict() for f in plan.findings],
    }


# ------------------------------------------------------------------------------------- commands
@app.command()
def recipes(as_json: JsonT = False) -> None:
    """List the recipes hpc-grpo can find."""
    from hpc_grpo.config.resolve import load_raw

    rows = []
    for name in registry.list_names("recipes"):
        data, _ = load_raw("recipes", name)
        rows.append({"name": name, "engine": data.get("engine", "verl"), "backend": data.get("backend", "fsdp"),
                     "model": (data.get("model") or {}).get("path", ""), "description": data.get("description", ""),
                     "path": str(registry.find("recipes", name))})
    if as_json:
        print_json(rows)
        return
    t = Table(title="Recipes")
    for col in ("name", "engine", "backend", "model", "description"):
        t.add_column(col, overflow="fold")
    for row in rows:
        t.add_row(row["name"], row["engine"], row["backend"], row["model"], row["description"])
    out.print(t)


@app.command()
def clusters(as_json: JsonT = False) -> None:
    """List the cluster profiles hpc-grpo can find."""
    from hpc_grpo.config.resolve import load_raw

    rows = []
    for name in registry.list_names("clusters"):
        data, _ = load_raw("clusters", name)
        rows.append({"name": name, "scheduler": data.get("scheduler", "slurm"), "partition": data.get("partition"),
                     "nodes_max": data.get("nodes_max"), "gpus_per_node": data.get("gpus_per_node"),
                     "gpu": data.get("gpu_type"), "description": data.get("description", ""),
                     "path": str(registry.find("clusters", name))})
    if as_json:
        print_json(rows)
        return
    t = Table(title="Clusters")
    for col in ("name", "scheduler", "partition", "nodes", "GPUs/node", "description"):
        t.add_column(col, overflow="fold")
    for row in rows:
        t.add_row(row["name"], row["scheduler"], str(row["partition"] or "-"), str(row["nodes_max"]),
                  str(row["gpus_per_node"]), row["description"])
    out.print(t)


@app.command()
def plan(args: ArgsT = None, as_json: JsonT = False, schema: SchemaT = True, name: NameT = None) -> None:
    """Check a recipe on a cluster: layout, batch math, memory per GPU, verl's schema. Writes nothing."""
    from hpc_grpo.planning.plan import run_plan

    result = run_plan(_resolve(args, name), schema=schema)
    if as_json:
        print_json(plan_json(result))
    else:
        print_plan(result)
    raise typer.Exit(0 if result.ok else 1)


@app.command()
def render(
    args: ArgsT = None,
    output: Annotated[Optional[Path], typer.Option("-o", "--output", help="folder to write into (default: print)")] = None,
    name: NameT = None,
    schema: SchemaT = True,
) -> None:
    """Render the frozen spec and every script of a run; print them or write them to -o DIR."""
    from hpc_grpo.planning.plan import run_plan
    from hpc_grpo.launch.render import render_all, write_files

    spec = _resolve(args, name)
    result = run_plan(spec, schema=schema)
    if not result.ok:
        print_findings(result.findings, err)
        err.print("Nothing rendered: fix the errors above.")
        raise typer.Exit(1)
    files = render_all(spec)
    if output is None:
        for rel, text in files.items():
            out.rule(rel)
            out.out(text, end="")
        return
    for path in write_files(output, files):
        out.print(str(path))


@app.command()
def submit(
    args: ArgsT = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="show everything submit would do; submit nothing")] = False,
    name: NameT = None,
    schema: SchemaT = True,
    wait: Annotated[Optional[bool], typer.Option("--wait/--no-wait", help="follow the job to its end "
                                                 "(default: on for cluster=local)")] = None,
) -> None:
    """Plan, create the run directory, render, and submit through submitit (Slurm or local)."""
    from hpc_grpo.planning.plan import run_plan
    from hpc_grpo.launch.render import render_all

    spec = _resolve(args, name)
    result = run_plan(spec, schema=schema, for_submit=True)
    if not result.ok:
        print_findings(result.findings, err)
        err.print("Nothing submitted: fix the errors above.")
        raise typer.Exit(1)
    files = render_all(spec)
    if dry_run:
        print_findings(result.findings)
        out.print(f"Would create {spec.run_dir} with:")
        for rel in files:
            out.print(f"  {rel}")
        print_would_queue(spec, files)
        return
    from hpc_grpo.launch.submit import submit_run

    submission = submit_run(spec, files)
    out.print(f"Run directory: {submission.run_dir}")
    out.print(f"Job: {submission.job_id} ({submission.executor})")
    out.print(f"Follow it: hpc-grpo status {spec.run_name}    logs: {submission.log_hint}")
    if wait is None:
        wait = spec.cluster.scheduler == "local"
    if wait:
        raise typer.Exit(wait_for(submission))


def print_would_queue(spec: Any, files: dict[str, str]) -> None:
    """What submit and resume --dry-run would hand to submitit: the job's script (shown) and the eval job after it."""
    eval_script = layout.EVAL_SBATCH_SCRIPT
    executor = "submitit SlurmExecutor" if spec.cluster.scheduler == "slurm" else "submitit LocalExecutor"
    out.print(f"Would submit {layout.SBATCH_SCRIPT} through {executor}" if spec.cluster.scheduler == "slurm"
              else f"Would run {layout.LAUNCH_SCRIPT} through {executor}")
    out.rule(layout.SBATCH_SCRIPT)
    out.out(files[layout.SBATCH_SCRIPT], end="")
    if eval_script in files:
        out.print(f"Would queue {eval_script} after it, adding #SBATCH --dependency=afterany:<its job id> "
                  "(the eval job evaluates only if the run is trained)")
        out.rule(eval_script)
        out.out(files[eval_script], end="")


def _print_from(path: Path, pos: int) -> int:
    """Print what a log gained since byte `pos` (the log-follow loops of submit --wait and logs -f); the new end."""
    if not path.is_file():
        return pos
    with open(path, errors="replace") as handle:
        handle.seek(pos)
        chunk = handle.read()
        pos = handle.tell()
    if chunk:
        sys.stdout.write(chunk)
        sys.stdout.flush()
    return pos


def wait_for(submission: Any) -> int:
    """Follow a job to its end, echoing its log, then print the run's status and training summary."""
    import time

    from hpc_grpo.commands.status import run_status

    log = Path(submission.log_hint)
    pos = 0
    job = submission.job
    while True:
        pos = _print_from(log, pos)
        if job.done():
            break
        time.sleep(1.0)
    state = job.state
    status = run_status(submission.run_dir)
    print_status(status)
    print_training_summary(submission.run_dir)
    from hpc_grpo.evaluation.evaluate import load_results

    results = load_results(submission.run_dir)
    for r in results:
        r["path"] = str(layout.eval_result(submission.run_dir, r["step"]))
    if results:
        print_eval_rows(results[-1:])
    # The run's own row for this job, not submitit's state: a local job that raised is "FINISHED" to submitit (and
    # on Slurm the chained eval job is the newest row).
    from hpc_grpo.commands.status import job_succeeded

    return 0 if job_succeeded(submission.run_dir, submission.job_id, state) else 1


def print_training_summary(run_dir: Path) -> None:
    from hpc_grpo.runstate.metrics import file_rows

    rows = file_rows(layout.metrics_file(run_dir))  # trl's rows or verl's file-logger rows, in one vocabulary
    if not rows:
        return
    t = Table(title="Training reward per step")
    for col in ("step", "reward", "loss", "kl"):
        t.add_column(col, justify="right")
    for row in rows:
        t.add_row(*(str(row.get(k)) if not isinstance(row.get(k), float) else f"{row[k]:.4f}"
                    for k in ("step", "reward", "loss", "kl")))
    out.print(t)
    out.print(f"Results: {run_dir}")


def print_status(status: Any) -> None:
    spec = status.spec
    out.print(f"[bold]{spec.run_name}[/]  recipe {spec.recipe.name}  cluster {spec.cluster.name}  dir {spec.run_dir}")
    t = Table(title="Jobs")
    for col in ("job", "purpose", "submitted", "state", "elapsed s", "exit", "nodes"):
        t.add_column(col)
    for j in status.jobs:
        t.add_row(j.job_id, j.purpose, j.submitted, j.state, str(j.elapsed_s if j.elapsed_s is not None else "-"),
                  j.exit_code or "-", j.nodes or "-")
    out.print(t)
    if status.restarts:
        t = Table(title="Restarts")
        for col in ("job", "start", "previous allocation ended", "cause", "resumed from step", "detail"):
            t.add_column(col, overflow="fold")
        for r in status.restarts:
            t.add_row(r.job_id, str(r.attempt), r.ended, r.cause,
                      "-" if r.resumed_step is None else str(r.resumed_step), r.detail or "-")
        out.print(t)
    for failure in status.failures:
        out.print(f"[bold red]stopped:[/] {failure}")
    if status.trained:
        from rich.markup import escape

        out.print(f"[bold green]{escape(status.trained)}[/]")
    out.print(f"Last step: {status.last_step if status.last_step is not None else '-'}   complete checkpoints: "
              f"{status.complete_checkpoints}   newest: {status.newest_checkpoint or '-'}   time used: {status.time_used_s} s")
    for log in status.logs:
        out.print(f"log: {log}")


def print_monitor(mon: Any) -> None:
    from rich.markup import escape  # the bar's [###---] would read as a markup tag

    from hpc_grpo.commands.monitor import bar, duration

    p = mon.progress
    total = f"~{p.total}" if p.total and p.total_estimated else p.total
    out.print(f"Progress: {escape(bar(p.step, p.total))}   {p.step_time_s or 0:.1f} s/step   ETA {duration(p.eta_s)}   "
              f"requeues {p.requeues}" + (f"   (total {total}, estimated from the data)" if p.total_estimated else ""))
    if mon.latest:
        names = ("reward", "kl", "grad_norm", "response_length")
        out.print("Latest (step {}): ".format(mon.latest.get("step")) + "   ".join(
            f"{k} {mon.latest[k]:.4g}" if isinstance(mon.latest.get(k), float) else f"{k} -" for k in names))
    out.print(f"[dim]metrics from {mon.source}[/]")
    for hint in mon.hints:
        out.print(f"[yellow]hint:[/] {escape(hint)}")


def print_gpus(job: str, rows: list[Any]) -> None:
    from hpc_grpo.commands.monitor import gpu_hints

    t = Table(title=f"GPUs of job {job} (nvidia-smi on every node, srun --overlap)")
    for col in ("node", "GPU", "name", "util %", "memory used MiB", "of MiB"):
        t.add_column(col, justify="right" if col not in ("node", "name") else "left")
    for g in rows:
        t.add_row(g.node, str(g.index), g.name, f"{g.util_pct:.0f}", f"{g.mem_used_mib:.0f}", f"{g.mem_total_mib:.0f}")
    out.print(t)
    for hint in gpu_hints(rows):
        out.print(f"[yellow]hint:[/] {hint}")


@app.command()
def status(
    run: Annotated[Optional[str], typer.Argument(help="run name or folder (default: the newest run)")] = None,
    as_json: JsonT = False,
    gpus: Annotated[bool, typer.Option("--gpus", help="nvidia-smi on every node of the running job")] = False,
    watch: Annotated[bool, typer.Option("--watch", help="then print the progress line at each new step while a "
                                        "job of the run is live")] = False,
) -> None:
    """Show a run: job chain with live Slurm state, progress, latest metrics and health hints, checkpoints, logs."""
    from hpc_grpo.commands.monitor import gpu_usage, monitor
    from hpc_grpo.commands.status import locate_run, run_status

    run_dir = locate_run(run)
    result = run_status(run_dir)
    if watch and not as_json:
        print_status(result)
        raise typer.Exit(watch_progress(run_dir, result.spec))
    mon = monitor(result.spec)
    gpu = gpu_usage(result.spec) if gpus else None
    if as_json:
        data = {**result.as_dict(), "monitor": mon.as_dict()}
        if gpu is not None:
            from dataclasses import asdict

            data["gpus"] = {"job": gpu[0], "rows": [asdict(g) for g in gpu[1]]}
        print_json(data)
        return
    print_status(result)
    print_monitor(mon)
    if gpu is not None:
        print_gpus(*gpu)


def watch_progress(run_dir: Path, spec: Any, interval_s: float = 5.0) -> int:
    """Print the progress line (and new hints) whenever the step changes, until no job of the run is live."""
    import time

    from rich.markup import escape

    from hpc_grpo.runstate import runs
    from hpc_grpo.commands.monitor import bar, duration, monitor

    last, hints = None, set()
    while True:
        mon = monitor(spec)
        p = mon.progress
        if p.step != last:
            last = p.step
            out.print(f"Progress: {escape(bar(p.step, p.total))}   {p.step_time_s or 0:.1f} s/step   "
                      f"ETA {duration(p.eta_s)}   requeues {p.requeues}")
            for hint in mon.hints:
                if hint not in hints:
                    hints.add(hint)
                    out.print(f"[yellow]hint:[/] {escape(hint)}")
        if not runs.live_jobs(run_dir):
            return 0
        time.sleep(interval_s)


@app.command()
def logs(
    run: Annotated[Optional[str], typer.Argument(help="run name or folder (default: the newest run)")] = None,
    follow: Annotated[bool, typer.Option("-f", "--follow", help="keep printing while the job runs")] = False,
    node: Annotated[int, typer.Option("--node", help="node index of the job (0: the driver's node)")] = 0,
    stderr: Annotated[bool, typer.Option("--err", help="the node's stderr log instead of stdout")] = False,
    job: Annotated[Optional[str], typer.Option("--job", help="job id (default: the run's newest job)")] = None,
) -> None:
    """Show or follow the driver's log, or one node's log, of a run's job."""
    import time

    from hpc_grpo.runstate import runs
    from hpc_grpo.commands.monitor import log_path, newest_job
    from hpc_grpo.config.resolve import load_frozen
    from hpc_grpo.commands.status import locate_run

    run_dir = locate_run(run)
    spec = load_frozen(layout.spec_file(run_dir))
    job = job or newest_job(run_dir)
    if job is None:
        raise SpecError(f"run {run_dir.name} has no job yet", key="run")
    if node < 0 or node >= spec.recipe.resources.nodes:
        raise SpecError(f"--node {node}: the run has nodes 0..{spec.recipe.resources.nodes - 1}", key="--node")
    path = log_path(spec, job, node, stderr)
    err.print(f"log: {path}")
    pos, next_check = 0, 0.0
    while True:
        pos = _print_from(path, pos)
        if not follow:
            break
        if time.monotonic() >= next_check:
            if job not in runs.live_jobs(run_dir):
                follow = False  # one more read picks up the last lines
                continue
            next_check = time.monotonic() + 5
        time.sleep(1.0)
    if pos == 0 and not path.is_file():
        err.print("(no log yet: the job has not started)")


@app.command()
def resume(
    args: Annotated[Optional[list[str]], typer.Argument(help="[RUN] [key=value ...] (resources.* and time limits)",
                                                        show_default=False)] = None,
    force: Annotated[bool, typer.Option("--force", help="allow other overrides; resubmit a finished run")] = False,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="show where it resumes and what it would queue; queue "
                                          "and write nothing")] = False,
    wait: Annotated[Optional[bool], typer.Option("--wait/--no-wait", help="follow the job to its end "
                                                 "(default: on for cluster=local)")] = None,
) -> None:
    """Resubmit a run from its frozen spec; training goes on from its newest complete checkpoint."""
    from hpc_grpo.commands.resume import plan_resume, submit_resume
    from hpc_grpo.commands.status import locate_run

    items = list(args or [])
    run = items.pop(0) if items and "=" not in items[0] else None
    plan = plan_resume(locate_run(run), items, force)
    spec = plan.spec
    for line in plan.describe(force):
        out.print(line)
    if plan.finished is not None and not force:
        return
    from hpc_grpo.planning.plan import run_plan

    checked = run_plan(spec, schema=False, for_submit=True)  # the overrides may not fit the cluster any more
    if not checked.ok:
        print_findings(checked.findings, err)
        err.print("Nothing submitted: fix the errors above.")
        raise typer.Exit(1)
    if dry_run:
        from hpc_grpo.launch.render import render_all

        print_findings(checked.findings)
        out.print(f"Overrides: {' '.join(plan.overrides) or 'none (the frozen spec as it is)'}")
        files = render_all(spec)
        out.print(f"Would rewrite in {spec.run_dir}: {', '.join(files)}; and add a 'resume' line to {layout.HISTORY_FILE}")
        print_would_queue(spec, files)
        return
    submission = submit_resume(plan)
    out.print(f"Job: {submission.job_id} ({submission.executor})")
    out.print(f"Follow it: hpc-grpo status {spec.run_name}    logs: {submission.log_hint}")
    if wait is None:
        wait = spec.cluster.scheduler == "local"
    if wait:
        raise typer.Exit(wait_for(submission))


@app.command("runs")
def list_runs(as_json: JsonT = False) -> None:
    """List runs under every cluster's runs root, newest first."""
    from hpc_grpo.runstate.runs import find_runs, run_summary
    from hpc_grpo.commands.status import runs_roots

    rows = [run_summary(p) for p in find_runs(runs_roots())]
    if as_json:
        print_json(rows)
        return
    t = Table(title="Runs")
    for col in ("name", "jobs", "path"):
        t.add_column(col, overflow="fold")
    for row in rows:
        t.add_row(row["name"], " ".join(row["jobs"]) or "-", row["path"])
    out.print(t)


# ------------------------------------------------------------------------------------ eval, report
StepT = Annotated[Optional[list[int]], typer.Option("--step", help="checkpoint step (repeatable; default: newest)")]


def print_eval_rows(results: list[dict[str, Any]]) -> None:
    from hpc_grpo.evaluation.evaluate import table_rows

    def pct(v: Any) -> str:
        return "-" if v is None else f"{v:.1%}"

    for result in results:
        t = Table(title=f"Evaluation: {result.get('run_name') or result['model']}")
        for col in ("", "model", "task", "n", "strict-match", "flexible-extract", "verl strict", "pass@1"):
            t.add_column(col, overflow="fold")
        for row in table_rows(result):
            t.add_row(row["what"], row["model"], row["task"], str(row["n"]), pct(row["strict"]),
                      pct(row["flexible"]), pct(row["verl"]), pct(row.get("pass@1")))
        out.print(t)
        rate = result.get("problems_per_s")
        out.print(f"wall time {result['wall_time_s']:.1f} s, {rate if rate is not None else '-'} problems/s; "
                  f"results: {result.get('path', '')}")


@app.command("eval")
def eval_cmd(
    run: Annotated[Optional[str], typer.Argument(help="run name or folder (default: the newest run)")] = None,
    step: StepT = None,
    all_kept: Annotated[bool, typer.Option("--all-kept", help="every complete checkpoint")] = False,
    tasks: Annotated[Optional[str], typer.Option("--tasks", help="gsm8k,gsm8k_cot,humaneval (default: the recipe's)")] = None,
    limit: Annotated[Optional[int], typer.Option("--limit", min=1, help="first K test problems")] = None,
    model: Annotated[Optional[Path], typer.Option("--model", help="evaluate this HF model folder instead")] = None,
    out_dir: Annotated[Optional[Path], typer.Option("--out", help="with --model: output folder")] = None,
    here: Annotated[Optional[bool], typer.Option("--here/--submit", help="run in this shell or as a Slurm job "
                                                 "(default: here on cluster=local)")] = None,
    test_file: Annotated[Optional[Path], typer.Option("--test-file", help="with --model: GSM8K test jsonl")] = None,
    train_file: Annotated[Optional[Path], typer.Option("--train-file", help="with --model: GSM8K train jsonl")] = None,
    num_fewshot: Annotated[Optional[int], typer.Option("--num-fewshot", min=0, help="with --model")] = None,
    max_gen_toks: Annotated[Optional[int], typer.Option("--max-gen-toks", min=1, help="with --model")] = None,
    as_json: JsonT = False,
) -> None:
    """Score a run's checkpoint(s) on GSM8K with lm-eval (beside the base model), or any model with --model."""
    from hpc_grpo.evaluation import evaluate

    task_list = [t for t in tasks.split(",") if t] if tasks else None
    if model is not None:
        folder = out_dir or Path.cwd() / f"eval-{model.name}"
        outcome = evaluate.eval_model(str(model), folder, task_list, limit, train_file and str(train_file),
                                      test_file and str(test_file), num_fewshot, max_gen_toks)
        for r in outcome.results:
            r["path"] = str(folder / evaluate.MODEL_RESULT)
    else:
        from hpc_grpo.commands.status import locate_run

        outcome = evaluate.eval_run(locate_run(run), list(step or []), all_kept, task_list, limit, here)
        for r in outcome.results:
            r["path"] = str(layout.eval_result(outcome.run_dir, r["step"]))
    if as_json:
        print_json({"ran_here": outcome.ran_here, "job_id": outcome.job_id, "after": outcome.after,
                    "results": [{k: v for k, v in r.items() if k != "scores"} | {"scores": {
                        t: {k: v for k, v in s.items() if k != "samples"} for t, s in r["scores"].items()}}
                        for r in outcome.results]})
        return
    if not outcome.ran_here:
        dep = f" ({evaluate.dependency(outcome.after)}, evaluates only if the run is trained)" if outcome.after else ""
        out.print(f"Eval job {outcome.job_id}{dep} queued; log: {outcome.log}")
        out.print(f"Results will be in {layout.eval_dir(outcome.run_dir)}, one file per step; see them with: "
                  f"hpc-grpo report {outcome.run_dir}")
        return
    print_eval_rows(outcome.results)


@app.command()
def rehearse(args: ArgsT = None, name: NameT = None) -> None:
    """Rehearse a verl FSDP recipe on CPU before it gets GPUs: the tiny model, a handful of the recipe's own rows, two
    steps with a checkpoint each, a resume, the export and one eval problem, through submit/resume/eval's own paths
    (the cluster's partition with no GPU asked, or locally). Exit 0 passed, 1 a step failed, 2 bad input."""
    from hpc_grpo.config.clusterpick import choose_cluster
    from hpc_grpo.commands.rehearse import run_rehearsal

    recipe, cluster, overrides = parse_args(args)
    choice = choose_cluster(cluster)
    err.print(f"cluster: {choice.name} ({choice.why})")
    outcome = run_rehearsal(recipe, choice.name, overrides, name, say=out.print)
    print_rehearsal(outcome)
    raise typer.Exit(0 if outcome.ok else 1)


def print_rows(title: str, cols: tuple[str, ...], rows: list[tuple[str, ...]]) -> None:
    """A table on a terminal; whole lines in pipes and CI logs, where a table folds paths and keys at 80 columns."""
    if not out.is_terminal:
        out.file.write(f"{title}:\n" + "".join("  " + "  |  ".join(r) + "\n" for r in rows))
        out.file.flush()
        return
    from rich.markup import escape

    t = Table(title=title)
    for col in cols:
        t.add_column(col, overflow="fold")
    for r in rows:
        t.add_row(*(escape(x) for x in r))
    out.print(t)


def print_rehearsal(outcome: Any) -> None:
    from rich.markup import escape

    from hpc_grpo.commands.rehearse import NOT_EXERCISED

    sh = outcome.shrink
    if sh.replaced:
        print_rows("Shrunk onto CPU (replaced)", ("key", "recipe", "rehearsal", "why"),
                   [(c.key, json.dumps(c.was), json.dumps(c.now), c.why) for c in sh.replaced])
        notable = [k for k in sh.kept if k.startswith(("passthrough.", "grpo.", "lora.", "checkpoint.", "offload."))
                   or k in ("data.filter_overlong_prompts", "data.truncation", "eval.tasks", "rollout.load_format",
                            "rollout.layered_summon", "train.test_freq")]
        out.print(f"Kept as the recipe has them ({len(sh.kept)} keys), among them: {', '.join(notable)}")
        if sh.resume_overrides:
            out.print(f"Resume overrides (hpc-grpo resume --force): {' '.join(sh.resume_overrides)}")
    if outcome.findings and not outcome.ok:
        print_findings(outcome.findings, err)
    if outcome.checks:
        print_rows(f"Exercised ({outcome.spec.run_dir})", ("", "what", "evidence"),
                   [("ok" if c.ok else "FAILED", c.what, c.evidence) for c in outcome.checks])
    print_rows("Not exercised on CPU (needs GPUs)", ("what", "why"), list(NOT_EXERCISED))
    if outcome.failed is not None:
        f = outcome.failed
        err.print(f"[bold red]rehearsal failed at step '{escape(f.step)}':[/] {escape(f.message)}"
                  + (f"\n  log: {f.log}" if f.log else ""))
    else:
        out.print(f"[bold green]Rehearsal passed[/]: {outcome.spec.run_dir}")


@app.command("export")
def export_cmd(
    run: Annotated[Optional[str], typer.Argument(help="run name or folder (default: the newest run)")] = None,
    step: Annotated[Optional[int], typer.Option("--step", help="checkpoint step (default: the newest complete one)")] = None,
) -> None:
    """Merge a checkpoint into a Hugging Face model folder, RUN/exports/step_N/ (verl FSDP: verl's merger), e.g. to
    start a new run from it at a world size the checkpoint cannot be resumed at."""
    from hpc_grpo.evaluation import export
    from hpc_grpo.job.eval_job import EvalError, base_model_path, choose
    from hpc_grpo.job.trl_job import JobError
    from hpc_grpo.config.resolve import load_frozen
    from hpc_grpo.commands.resume import new_run_command
    from hpc_grpo.commands.status import locate_run

    spec = load_frozen(layout.spec_file(locate_run(run)))
    try:
        (ckpt,) = choose(spec, [] if step is None else [step], all_kept=False)
    except EvalError as exc:
        raise SpecError(str(exc), key="run" if step is None else "--step") from None
    try:
        with export.leased(spec.path, spec.recipe.engine, ckpt.step) as fresh:
            out.print(f"Exporting step {fresh.step} ({fresh.layout}) from {fresh.path}")
            folder = export.export_checkpoint(spec.path, fresh.step, fresh.path, fresh.layout, base_model_path(spec))
    except (export.ExportError, JobError) as exc:
        err.print(f"[bold red]error:[/] {exc}")
        raise typer.Exit(1) from None
    out.print(f"Exported: {folder} ({export.export_info(folder).get('how', '')})")
    out.print(f"A new run from these weights: {new_run_command(spec, folder)}")


@app.command()
def report(
    run: Annotated[Optional[str], typer.Argument(help="run name or folder (default: the newest run)")] = None,
    png: Annotated[Optional[Path], typer.Option("--png", help=f"where to write the figure (default: RUN/{layout.REPORT_FILE})")] = None,
) -> None:
    """Training curves (reward, KL, response length, entropy) and GSM8K accuracy per step: a PNG and a summary."""
    from hpc_grpo.commands import report as report_mod
    from hpc_grpo.commands.status import locate_run

    run_dir = locate_run(run)
    rep = report_mod.build(run_dir)
    for line in rep.summary():
        out.print(line)
    path = report_mod.draw(rep, png or layout.report_file(run_dir))
    out.print(f"Figure: {path}")
@app.command("prune-ckpts")
def prune_ckpts(
    run: Annotated[Optional[str], typer.Argument(help="run name or folder (default: the newest run)")] = None,
    all_runs: Annotated[bool, typer.Option("--all", help="every run under every runs root")] = False,
    keep_last: Annotated[Optional[int], typer.Option(min=1, help="newest complete checkpoints to keep")] = None,
    keep_every: Annotated[Optional[int], typer.Option(min=1, help="also keep steps that are multiples of M")] = None,
    keep_best: Annotated[Optional[str], typer.Option(help="METRIC[:max|min]: also keep the best checkpoint")] = None,
    max_bytes: Annotated[Optional[str], typer.Option(help="cap on kept checkpoints + exports, e.g. 200G")] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="show the verdicts, change nothing")] = False,
    as_json: JsonT = False,
) -> None:
    """Apply the retention policy (the recipe's checkpoint section, overridden by options) to a run's checkpoints."""
    from hpc_grpo.runstate.retention import cli_prune

    results = cli_prune(run, all_runs, keep_last=keep_last, keep_every=keep_every, keep_best=keep_best,
                        max_bytes=max_bytes, dry_run=dry_run)
    if as_json:
        print_json([r.as_dict() for r in results] if all_runs else results[0].as_dict())
    else:
        for r in results:
            print_prune(r)
    if any(r.errors for r in results):
        raise typer.Exit(1)


def print_prune(result: Any) -> None:
    from hpc_grpo.runstate.retention import fmt_bytes

    t = Table(title=f"{result.run_dir.name}: checkpoints ({result.engine})" + (" [dry run]" if result.dry_run else ""))
    for col in ("step", "size", "complete", "verdict", "because"):
        t.add_column(col, overflow="fold", justify="right" if col in ("step", "size") else "left")
    for v in [*result.verdicts, *result.quarantine]:
        step = str(v.step) if v.step >= 0 else v.path.name
        size = fmt_bytes(v.size_bytes + v.export_bytes)
        done = {True: "yes", False: "no", None: "-"}[v.complete]
        verdict = "[green]keep[/]" if v.keep else ("[yellow]would remove[/]" if result.dry_run else "[red]removed[/]")
        t.add_row(step, size, done, verdict, v.reason)
    out.print(t)
    for note in result.notes:
        out.print(f"note: {note}")
    for e in result.errors:
        err.print(f"[bold red]error:[/] {e}")
    out.print(f"{'would free' if result.dry_run else 'freed'} {fmt_bytes(result.freed_bytes)}")


@data_app.command("gsm8k")
def data_gsm8k(
    source: Annotated[str, typer.Option(help="'hf' (openai/gsm8k from the Hub) or a folder with train.jsonl and test.jsonl")] = "hf",
    out_dir: Annotated[Path, typer.Option("--out", help="output folder")] = Path("~/hpc-grpo-data/gsm8k"),
) -> None:
    """Write GSM8K in verl's parquet format and the trl engine's jsonl format."""
    from hpc_grpo.data.gsm8k import prepare_gsm8k

    result = prepare_gsm8k(source, out_dir.expanduser())
    out.print(f"GSM8K from {result.source}: {result.n_train} train, {result.n_test} test rows")
    for p in (result.verl_train, result.verl_test, result.trl_train, result.trl_test):
        out.print(f"  {p}")


@data_app.command("codegen")
def data_codegen(
    source: Annotated[str, typer.Option(help="problems file (JSON/JSONL: ours, MBPP, APPS/TACO, HumanEval layout), "
                                             "'tiny' (the 16 shipped problems) or hf:NAME[:CONFIG] when online")] = "tiny",
    out_dir: Annotated[Path, typer.Option("--out", help="output folder")] = Path("~/hpc-grpo-data/codegen"),
    test_every: Annotated[int, typer.Option(help="every N-th problem goes to the test split (0: test = train)")] = 4,
    max_prompt_tokens: Annotated[Optional[int], typer.Option(help="drop longer prompts (needs --tokenizer)")] = None,
    tokenizer: Annotated[Optional[str], typer.Option(help="model folder whose tokenizer counts prompt tokens")] = None,
) -> None:
    """Write code problems with their tests in verl's parquet format and the trl engine's jsonl format."""
    from hpc_grpo.data.codegen import SHIPPED_PROBLEMS, prepare_codegen

    src = str(SHIPPED_PROBLEMS) if source == "tiny" else source
    result = prepare_codegen(src, out_dir.expanduser(), test_every, max_prompt_tokens, tokenizer)
    out.print(f"code problems from {result.source}: {result.n_train} train, {result.n_test} test rows"
              + (f", {result.dropped_overlong} overlong prompts dropped" if result.dropped_overlong else ""))
    for p in (result.verl_train, result.verl_test, result.trl_train, result.trl_test):
        out.print(f"  {p}")


@app.command("eval-code")
def eval_code(
    run: Annotated[Optional[str], typer.Argument(help="a finished run's name or folder: its base model and its "
                                                 "trained policy")] = None,
    model: Annotated[Optional[str], typer.Option(help="evaluate this model folder instead of a run")] = None,
    limit: Annotated[Optional[int], typer.Option(help="first N HumanEval problems (default: all 164)")] = None,
    n: Annotated[int, typer.Option(help="samples per problem (sampled when > 1)")] = 1,
    k: Annotated[Optional[list[int]], typer.Option(help="pass@k to report (k <= n; repeatable)")] = None,
    max_new_tokens: Annotated[int, typer.Option(help="tokens per sample")] = 512,
    temperature: Annotated[float, typer.Option(help="sampling temperature when n > 1")] = 0.8,
    json_out: Annotated[Optional[Path], typer.Option("--json-out", help="also write the report here")] = None,
) -> None:
    """HumanEval pass@1 / pass@k through the sandboxed executor, base model beside the policy of a run."""
    from hpc_grpo.evaluation.humaneval import evaluate_humaneval, evaluate_run

    if (run is None) == (model is None):
        raise SpecError("eval-code: give a run (its name or folder) or --model (one of them)")
    ks = sorted(set(k or [1]))
    if any(x < 1 or x > n for x in ks):
        raise SpecError(f"--k {ks}: each k must be between 1 and --n={n}")
    opts = {"limit": limit, "n": n, "ks": ks, "max_new_tokens": max_new_tokens, "temperature": temperature}
    if run is not None:
        from hpc_grpo.commands.status import locate_run

        report = evaluate_run(locate_run(run), **opts)
    else:
        report = {"task": "humaneval", "models": [evaluate_humaneval(model, **opts)]}
    if json_out:
        json_out.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    t = Table(title="HumanEval")
    for col in ("model", "problems", "n", *[f"pass@{x}" for x in ks], "outcomes"):
        t.add_column(col)
    for m in report["models"]:
        t.add_row(m["label"], str(m["problems"]), str(m["n"]), *[f"{m.get(f'pass@{x}', float('nan')):.3f}" for x in ks],
                  " ".join(f"{kk}={v}" for kk, v in sorted(m["outcomes"].items())))
    out.print(t)


@model_app.command("tiny")
def model_tiny(
    out_dir: Annotated[Path, typer.Option("--out", help="output folder")] = Path("~/.cache/hpc-grpo/tiny-qwen2"),
    seed: Annotated[int, typer.Option(help="random seed")] = 0,
) -> None:
    """Build a tiny random Qwen2-architecture model with a locally trained tokenizer (no Hub needed)."""
    from hpc_grpo.data.tiny_model import ensure_tiny_model

    path = ensure_tiny_model(out_dir.expanduser(), seed=seed)
    out.print(f"Tiny model at {path}")


def main() -> None:
    """Console entry point: input errors exit 2 with a message that names the key and the fix."""
    try:
        rc = app(standalone_mode=False)
        sys.exit(rc if isinstance(rc, int) else 0)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except SpecError as exc:
        err.print(f"[bold red]error:[/] {exc}")
        sys.exit(2)
    except typer.Abort:
        err.print("Aborted.")
        sys.exit(1)
    except Exception as exc:
        # Usage errors (unknown option, missing value) are click exceptions from typer's bundled click: they
        # print themselves and carry their exit code (2).
        if callable(getattr(exc, "show", None)) and isinstance(getattr(exc, "exit_code", None), int):
            exc.show()
            sys.exit(exc.exit_code)
        raise


if __name__ == "__main__":
    main()
