"""`hpc-grpo resume`, `export` and `prune-ckpts`: what is done with a run's checkpoints, printed. The checks and
the work are in hpc_grpo.commands (resume, export, prune)."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from hpc_grpo.cli.console import Table, out, print_error, print_findings, print_json
from hpc_grpo.cli.options import JsonT, RunT, VerboseT, WaitT
from hpc_grpo.cli.run_cmds import print_submitted, print_would_queue, refuse_unless_ok


def resume(
    args: Annotated[list[str] | None, typer.Argument(help="[RUN] [key=value ...] (resources.* and time limits)",
                                                        show_default=False)] = None,
    force: Annotated[bool, typer.Option("--force", help="allow other overrides; resubmit a finished run")] = False,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="show where it resumes and what it would queue; queue "
                                          "and write nothing")] = False,
    wait: WaitT = None,
    verbose: VerboseT = False,
) -> None:
    """Resubmit a run from its frozen spec; training goes on from its newest complete checkpoint. Given a sweep, its
    unfinished members, as one job array."""
    from hpc_grpo.commands.resume import check_plan, plan_resume, submit_resume
    from hpc_grpo.commands.status import locate_run
    from hpc_grpo.commands.sweep import is_sweep

    items = list(args or [])
    run = items.pop(0) if items and "=" not in items[0] else None
    if run is not None and is_sweep(run):
        resume_sweep(run, items, force, dry_run)
        return
    plan = plan_resume(locate_run(run), items, force)
    spec = plan.spec
    for line in plan.describe(force):
        out.print(line)
    if plan.nothing_to_do(force):
        return
    checked = check_plan(plan)
    refuse_unless_ok(checked, "Nothing submitted")
    if dry_run:
        from hpc_grpo.launch.render import render_all
        from hpc_grpo.runstate.layout import HISTORY_FILE

        print_findings(checked.findings)
        out.print(f"Overrides: {' '.join(plan.overrides) or 'none (the frozen spec as it is)'}")
        files = render_all(spec)
        out.print(f"Would rewrite in {spec.run_dir}: {', '.join(files)}; and add a 'resume' line to {HISTORY_FILE}")
        print_would_queue(spec, files)
        return
    print_submitted(submit_resume(plan), spec, wait, verbose)


def resume_sweep(name: str, items: list[str], force: bool, dry_run: bool) -> None:
    """`resume SWEEP`: the members that did not finish and have no live job, planned each, queued as one array."""
    from hpc_grpo.commands.sweep import check_sweep_resume, locate_sweep, plan_sweep_resume, submit_sweep_resume

    plan = plan_sweep_resume(locate_sweep(name), items, force)
    for member, why in plan.skipped:
        out.print(f"member {member.index} ({member.name}): not resumed, {why}")
    if not plan.plans:
        out.print(f"Sweep {plan.manifest.name}: no member to resume.")
        return
    check_sweep_resume(plan)
    for member, p in zip(plan.members, plan.plans):
        out.print(f"member {member.index} ({member.name}): {p.from_text()}")
    if dry_run:
        out.print("Dry run: nothing written or queued.")
        return
    subs = submit_sweep_resume(plan)
    out.print(f"Job array: {subs[0].job_id.split('_', 1)[0]} ({', '.join(s.job_id for s in subs)}, "
              f"%{plan.manifest.parallel})")


def export_cmd(
    run: RunT = None,
    step: Annotated[int | None, typer.Option("--step", help="checkpoint step (default: the newest complete one)")] = None,
) -> None:
    """Merge a checkpoint into a Hugging Face model folder, RUN/exports/step_N/ (verl FSDP: verl's merger), e.g. to
    start a new run from it at a world size the checkpoint cannot be resumed at."""
    from hpc_grpo.commands.export import FAILURES, export_run

    def starting(ckpt: Any) -> None:
        out.print(f"Exporting step {ckpt.step} ({ckpt.layout}) from {ckpt.path}")

    try:
        done = export_run(run, step, starting)
    except FAILURES as exc:
        print_error(exc)
        raise typer.Exit(1) from None
    out.print(f"Exported: {done.folder} ({done.how})")
    out.print(f"A new run from these weights: {done.new_run}")


def prune_ckpts(
    run: RunT = None,
    all_runs: Annotated[bool, typer.Option("--all", help="every run under every runs root")] = False,
    keep_last: Annotated[int | None, typer.Option(min=1, help="newest complete checkpoints to keep")] = None,
    keep_every: Annotated[int | None, typer.Option(min=1, help="also keep steps that are multiples of M")] = None,
    keep_best: Annotated[str | None, typer.Option(help="METRIC[:max|min]: also keep the best checkpoint")] = None,
    max_bytes: Annotated[str | None, typer.Option(help="cap on kept checkpoints + exports, e.g. 200G")] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="show the verdicts, change nothing")] = False,
    as_json: JsonT = False,
) -> None:
    """Apply the retention policy (the recipe's checkpoint section, overridden by options) to a run's checkpoints."""
    from hpc_grpo.commands.prune import prune_runs

    results = prune_runs(run, all_runs, keep_last=keep_last, keep_every=keep_every, keep_best=keep_best,
                         max_bytes=max_bytes, dry_run=dry_run)
    if as_json:
        print_json([r.as_dict() for r in results] if all_runs else results[0].as_dict())
    else:
        for r in results:
            print_prune(r)
    if any(r.errors for r in results):
        raise typer.Exit(1)


def print_prune(result: Any) -> None:
    from hpc_grpo.runstate.prune import fmt_bytes

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
        print_error(e)
    out.print(f"{'would free' if result.dry_run else 'freed'} {fmt_bytes(result.freed_bytes)}")
