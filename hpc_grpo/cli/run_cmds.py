"""`hpc-grpo plan`, `render`, `submit` and `rehearse`: a recipe on a cluster, checked, rendered, submitted or
rehearsed on CPU, printed. Planning is hpc_grpo.planning.plan, rendering hpc_grpo.launch.render, submission
hpc_grpo.launch.submit, the rehearsal hpc_grpo.commands.rehearse."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from hpc_grpo.cli.console import Table, err, out, print_findings, print_json, print_reward_note, print_rows
from hpc_grpo.cli.options import AcceptT, ArgsT, JsonT, NameT, SchemaT, VerboseT, WaitT, parse_args, pick_cluster, resolve
from hpc_grpo.cli.watch_cmds import wait_for


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
            source = sched.step_source or "rough, calibrated on a 3B LoRA run on 4x A100"
            out.print(f"  ~{sched.step_s:.3g} s per step ({escape_text(source)}): ~{sched.steps_in_time_limit} "
                      f"steps fit in resources.time {r.resources.time}")
    if plan.cost is not None:
        out.print(f"[bold]Cost[/]: {escape_text(plan.cost.describe())}")
    print_eval_plan(spec)
    if (wb := wandb_run(spec)) is not None:
        out.print(f"W&B: {wandb_line(wb)}", markup=False, highlight=False)
    out.print(f"Engine schema: {plan.schema_checked}")
    print_code_isolation(plan)
    print_findings(plan.findings)


def wandb_run(spec: Any) -> dict[str, Any] | None:
    """The W&B run the job logs to (project, name, id, group), where W&B is a logger; else None."""
    lg = spec.recipe.logging
    if "wandb" not in lg.logger:
        return None
    from hpc_grpo.runstate.runs import wandb_run_id

    return {"project": lg.project, "name": lg.experiment or spec.run_name, "id": wandb_run_id(spec.path),
            "group": lg.group}


def wandb_line(wb: dict[str, Any]) -> str:
    return (f"project {wb['project']}, run {wb['name']} (id {wb['id']})"
            + (f", group {wb['group']}" if wb["group"] else ", no group (logging.group)"))


def escape_text(text: str) -> str:
    from rich.markup import escape

    return escape(text)


def print_eval_plan(spec: Any) -> None:
    """Which tasks the evaluation after training runs, and where (evaluation.evaluate.summary)."""
    from rich.markup import escape

    from hpc_grpo.evaluation.evaluate import describe, summary

    out.print(f"[bold]Evaluation[/]: {escape(describe(summary(spec)))}")


def print_code_isolation(plan: Any) -> None:
    """The code sandbox's isolation on the compute nodes, for a run that executes model-written code."""
    if plan.code_isolation:
        out.print(f"Code sandbox: {plan.code_isolation}", markup=False, highlight=False)


def shown(value: Any) -> str:
    """A config value as the user would type it (lists and None as Hydra writes them)."""
    from hpc_grpo.config.verl_keys import format_value

    return value if isinstance(value, str) and value.startswith(("(", "???")) else format_value(value)


def print_defaults_diff(plan: Any) -> None:
    """plan --diff-defaults: one row per verl key away from verl's default (interpolated defaults resolved)."""
    if plan.defaults_diff is None:
        out.print(f"verl defaults: {plan.defaults_note}", markup=False)
        return
    rows = [(str(d.key), shown(d.default) + (f" (= {d.interpolation})" if d.interpolation else ""), shown(d.value), str(d.why))
            for d in plan.defaults_diff]
    print_rows(f"verl defaults this run changes ({plan.defaults_note})", ("verl key", "verl default", "this run", "why"),
               rows)


def plan_json(plan: Any) -> dict[str, Any]:
    from dataclasses import asdict

    from hpc_grpo.evaluation.evaluate import summary

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
        "cost": None if plan.cost is None else plan.cost.as_dict(),
        "eval": summary(plan.spec),
        "wandb": wandb_run(plan.spec),
        "schema": plan.schema_checked,
        "code_isolation": plan.code_isolation,
        "findings": [f.as_dict() for f in plan.findings],
        **({} if plan.defaults_note == "" else {"diff_defaults": {
            "note": plan.defaults_note,
            "keys": None if plan.defaults_diff is None else [d.as_dict() for d in plan.defaults_diff]}}),
    }


def refuse_unless_ok(result: Any, what: str) -> None:
    """A plan with errors: its findings on stderr, `what` was not done, exit 1."""
    if not result.ok:
        print_findings(result.findings, err)
        err.print(f"{what}: fix the errors above.")
        raise typer.Exit(1)


def print_would_queue(spec: Any, files: dict[str, str]) -> None:
    """What submit and resume --dry-run would hand to submitit: the job's script (shown) and the eval job after it."""
    from hpc_grpo.runstate.layout import EVAL_SBATCH_SCRIPT, LAUNCH_SCRIPT, SBATCH_SCRIPT

    executor = "submitit SlurmExecutor" if spec.cluster.scheduler == "slurm" else "submitit LocalExecutor"
    out.print(f"Would submit {SBATCH_SCRIPT} through {executor}" if spec.cluster.scheduler == "slurm"
              else f"Would run {LAUNCH_SCRIPT} through {executor}")
    out.rule(SBATCH_SCRIPT)
    out.out(files[SBATCH_SCRIPT], end="")
    if EVAL_SBATCH_SCRIPT in files:
        out.print(f"Would queue {EVAL_SBATCH_SCRIPT} after it, adding #SBATCH --dependency=afterany:<its job id> "
                  "(the eval job evaluates only if the run is trained)")
        out.rule(EVAL_SBATCH_SCRIPT)
        out.out(files[EVAL_SBATCH_SCRIPT], end="")


def print_submitted(submission: Any, spec: Any, wait: bool | None, verbose: bool = False) -> None:
    """The job's id and where to follow it; then, with --wait (default on cluster=local), follow it to its end."""
    from hpc_grpo.commands.watch import waits_by_default

    out.print(f"Job: {submission.job_id} ({submission.executor})")
    if submission.eval is not None:
        out.print(f"Eval job: {submission.eval.job_id} (afterany {submission.job_id})")
    print_eval_plan(spec)
    print_reward_note(spec.recipe.health.reward_note)
    out.print(f"Follow it: hpc-grpo status {spec.run_name}    logs: {submission.log_hint}")
    if wait is None:
        wait = waits_by_default(spec)
    if wait:
        raise typer.Exit(wait_for(submission, verbose))


BudgetT = Annotated[float | None, typer.Option("--budget-gpu-hours", help="refuse (exit 2) when the predicted "
                   "GPU-hours (training and its eval job) are over this; a sweep's: its upper bound, every member "
                   "to its last step")]
DiffT = Annotated[bool, typer.Option("--diff-defaults", help="also list every verl key this run sets away from "
                                     "verl's own defaults, and what set it (needs verl's config files)")]


def plan(args: ArgsT = None, as_json: JsonT = False, schema: SchemaT = True, name: NameT = None,
         diff_defaults: DiffT = False, accept: AcceptT = None) -> None:
    """Check a recipe on a cluster: layout, batch math, memory per GPU, verl's schema. Writes nothing."""
    from hpc_grpo.planning.plan import check_accept, run_plan

    accepted = check_accept(accept or [])
    result = run_plan(resolve(args, name), schema=schema, diff_defaults=diff_defaults, accept=accepted)
    if as_json:
        print_json(plan_json(result))
    else:
        if diff_defaults:
            print_defaults_diff(result)
        print_plan(result)
    raise typer.Exit(0 if result.ok else 1)


def render(
    args: ArgsT = None,
    output: Annotated[Path | None, typer.Option("-o", "--output", help="folder to write into (default: print)")] = None,
    name: NameT = None,
    schema: SchemaT = True,
    accept: AcceptT = None,
) -> None:
    """Render the frozen spec and every script of a run; print them or write them to -o DIR."""
    from hpc_grpo.launch.render import render_all, write_files
    from hpc_grpo.planning.plan import check_accept, run_plan

    accepted = check_accept(accept or [])
    result = run_plan(resolve(args, name), schema=schema, accept=accepted)
    refuse_unless_ok(result, "Nothing rendered")
    files = render_all(result.spec)  # the spec records what was accepted
    if output is None:
        for rel, text in files.items():
            out.rule(rel)
            out.out(text, end="")
        return
    for path in write_files(output, files):
        out.print(str(path))


def submit(
    args: ArgsT = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="show everything submit would do; submit nothing")] = False,
    name: NameT = None,
    schema: SchemaT = True,
    wait: WaitT = None,
    accept: AcceptT = None,
    verbose: VerboseT = False,
    budget: BudgetT = None,
) -> None:
    """Plan, create the run directory, render, and submit through submitit (Slurm or local)."""
    from hpc_grpo.launch.render import render_all
    from hpc_grpo.planning.plan import check_accept, run_plan

    accepted = check_accept(accept or [])
    result = run_plan(resolve(args, name), schema=schema, for_submit=True, accept=accepted)
    refuse_unless_ok(result, "Nothing submitted")
    if budget is not None:
        from hpc_grpo.planning.cost import check_budget

        cost: Any = result.cost
        check_budget([(result.spec.run_name, cost)], budget)
        out.print(f"Within --budget-gpu-hours {budget:g}: {escape_text(cost.describe())}")
    spec = result.spec  # records what was accepted (spec.yaml)
    files = render_all(spec)
    print_code_isolation(result)
    if dry_run:
        print_findings(result.findings)
        print_eval_plan(spec)
        out.print(f"Would create {spec.run_dir} with:")
        for rel in files:
            out.print(f"  {rel}")
        print_would_queue(spec, files)
        return
    from hpc_grpo.launch.submit import submit_run

    submission = submit_run(spec, files)
    out.print(f"Run directory: {submission.run_dir}")
    print_submitted(submission, spec, wait, verbose)


def rehearse(args: ArgsT = None, name: NameT = None) -> None:
    """Rehearse a verl recipe (FSDP or Megatron) on CPU before it gets GPUs: the tiny model, a handful of the
    recipe's own rows, two steps with a checkpoint each, a resume, the export and one eval problem, through
    submit/resume/eval's own paths (the cluster's partition with no GPU asked, or locally). Exit 0 passed, 1 a step
    failed, 2 bad input."""
    from hpc_grpo.commands.rehearse import run_rehearsal

    recipe, cluster, overrides = parse_args(args)
    outcome = run_rehearsal(recipe, pick_cluster(cluster), overrides, name, say=out.print)
    print_rehearsal(outcome)
    raise typer.Exit(0 if outcome.ok else 1)


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
    if sh.rollout:
        out.print(f"Rollout exercised: {escape(sh.rollout)}")
    print_rows("Not exercised on CPU (needs GPUs)", ("what", "why"), list(NOT_EXERCISED))
    if outcome.failed is not None:
        f = outcome.failed
        err.print(f"[bold red]rehearsal failed at step '{escape(f.step)}':[/] {escape(f.message)}"
                  + (f"\n  log: {f.log}" if f.log else ""))
    else:
        out.print(f"[bold green]Rehearsal passed[/]: {outcome.spec.run_dir}")
