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

from hpc_grpo import registry
from hpc_grpo.findings import Finding, Severity
from hpc_grpo.yamlio import SpecError

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
    from hpc_grpo.resolve import resolve_spec

    recipe, cluster, overrides = parse_args(args)
    return resolve_spec(recipe, cluster, overrides, run_name=name)


# ------------------------------------------------------------------------------------- printing
_STYLE = {Severity.ERROR: "bold red", Severity.WARNING: "yellow", Severity.INFO: "dim"}


def print_findings(findings: list[Finding], console: Any = out) -> None:
    if not findings:
        console.print("No findings.")
        return
    t = Table(title="Findings", show_lines=False)
    for col in ("severity", "key", "message", "fix"):
        t.add_column(col, overflow="fold")
    order = {Severity.ERROR: 0, Severity.WARNING: 1, Severity.INFO: 2}
    for f in sorted(findings, key=lambda f: order[f.severity]):
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
        t.add_row("[bold]peak[/]", f"[bold]{est.total_gib:.1f} of {est.capacity_gib:.0f}[/]")
        out.print(t)
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
            "fits": plan.memory.fits, "largest_term": plan.memory.largest_term},
        "schema": plan.schema_checked,
        "findings": [f.as_dict() for f in plan.findings],
    }


# ------------------------------------------------------------------------------------- commands
@app.command()
def recipes(as_json: JsonT = False) -> None:
    """List the recipes hpc-grpo can find."""
    from hpc_grpo.resolve import load_raw

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
    from hpc_grpo.resolve import load_raw

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
    from hpc_grpo.plan import run_plan

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
    from hpc_grpo.plan import run_plan
    from hpc_grpo.render import render_all, write_files

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
    from hpc_grpo.plan import run_plan
    from hpc_grpo.render import render_all

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
        executor = "submitit SlurmExecutor" if spec.cluster.scheduler == "slurm" else "submitit LocalExecutor"
        out.print(f"Would submit scripts/sbatch.sh through {executor}" if spec.cluster.scheduler == "slurm"
                  else f"Would run scripts/launch.sh through {executor}")
        out.rule("scripts/sbatch.sh")
        out.out(files["scripts/sbatch.sh"], end="")
        return
    from hpc_grpo.submit import submit_run

    submission = submit_run(spec, files)
    out.print(f"Run directory: {submission.run_dir}")
    out.print(f"Job: {submission.job_id} ({submission.executor})")
    out.print(f"Follow it: hpc-grpo status {spec.run_name}    logs: {submission.log_hint}")
    if wait is None:
        wait = spec.cluster.scheduler == "local"
    if wait:
        raise typer.Exit(wait_for(submission))


def wait_for(submission: Any) -> int:
    """Follow a job to its end, echoing its log, then print the run's status and training summary."""
    import time

    from hpc_grpo.status import run_status

    log = Path(submission.log_hint)
    pos = 0
    job = submission.job
    while True:
        if log.exists():
            with open(log, errors="replace") as handle:
                handle.seek(pos)
                chunk = handle.read()
                pos = handle.tell()
            if chunk:
                sys.stdout.write(chunk)
                sys.stdout.flush()
        if job.done():
            break
        time.sleep(1.0)
    state = job.state
    status = run_status(submission.run_dir)
    print_status(status)
    print_training_summary(submission.run_dir)
    # The run's own row, not submitit's state: a local job that raised is "FINISHED" to submitit.
    ok = status.jobs[-1].state == "COMPLETED" if status.jobs else state == "COMPLETED"
    return 0 if ok else 1


def print_training_summary(run_dir: Path) -> None:
    metrics = run_dir / "metrics.jsonl"
    if not metrics.exists():
        return
    rows = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
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
    out.print(f"Last step: {status.last_step if status.last_step is not None else '-'}   complete checkpoints: "
              f"{status.complete_checkpoints}   newest: {status.newest_checkpoint or '-'}   time used: {status.time_used_s} s")
    for log in status.logs:
        out.print(f"log: {log}")


@app.command()
def status(
    run: Annotated[Optional[str], typer.Argument(help="run name or folder (default: the newest run)")] = None,
    as_json: JsonT = False,
) -> None:
    """Show a run: its job chain with live Slurm state, last step, newest checkpoint, time used, logs."""
    from hpc_grpo.status import locate_run, run_status

    result = run_status(locate_run(run))
    if as_json:
        print_json(result.as_dict())
    else:
        print_status(result)


@app.command()
def resume(
    args: Annotated[Optional[list[str]], typer.Argument(help="[RUN] [key=value ...] (resources.* and time limits)",
                                                        show_default=False)] = None,
    force: Annotated[bool, typer.Option("--force", help="allow other overrides; resubmit a finished run")] = False,
    wait: Annotated[Optional[bool], typer.Option("--wait/--no-wait", help="follow the job to its end "
                                                 "(default: on for cluster=local)")] = None,
) -> None:
    """Resubmit a run from its frozen spec; training goes on from its newest complete checkpoint."""
    from hpc_grpo.resume import plan_resume, submit_resume
    from hpc_grpo.status import locate_run

    items = list(args or [])
    run = items.pop(0) if items and "=" not in items[0] else None
    plan = plan_resume(locate_run(run), items, force)
    spec = plan.spec
    for line in plan.describe(force):
        out.print(line)
    if plan.finished is not None and not force:
        return
    from hpc_grpo.plan import run_plan

    checked = run_plan(spec, schema=False, for_submit=True)  # the overrides may not fit the cluster any more
    if not checked.ok:
        print_findings(checked.findings, err)
        err.print("Nothing submitted: fix the errors above.")
        raise typer.Exit(1)
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
    from hpc_grpo.runs import find_runs, run_summary
    from hpc_grpo.status import runs_roots

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


@data_app.command("gsm8k")
def data_gsm8k(
    source: Annotated[str, typer.Option(help="'hf' (openai/gsm8k from the Hub) or a folder with train.jsonl and test.jsonl")] = "hf",
    out_dir: Annotated[Path, typer.Option("--out", help="output folder")] = Path("~/hpc-grpo-data/gsm8k"),
) -> None:
    """Write GSM8K in verl's parquet format and the trl engine's jsonl format."""
    from hpc_grpo.data import prepare_gsm8k

    result = prepare_gsm8k(source, out_dir.expanduser())
    out.print(f"GSM8K from {result.source}: {result.n_train} train, {result.n_test} test rows")
    for p in (result.verl_train, result.verl_test, result.trl_train, result.trl_test):
        out.print(f"  {p}")


@model_app.command("tiny")
def model_tiny(
    out_dir: Annotated[Path, typer.Option("--out", help="output folder")] = Path("~/.cache/hpc-grpo/tiny-qwen2"),
    seed: Annotated[int, typer.Option(help="random seed")] = 0,
) -> None:
    """Build a tiny random Qwen2-architecture model with a locally trained tokenizer (no Hub needed)."""
    from hpc_grpo.tiny_model import ensure_tiny_model

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
