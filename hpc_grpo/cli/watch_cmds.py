"""`hpc-grpo status` and `logs`, and the following of a job by `submit --wait` / `resume --wait`: what a run is
doing, printed. The reading, waiting and deciding is in hpc_grpo.commands (status, monitor, logs, watch)."""

from __future__ import annotations

import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Annotated, Any

import typer

from hpc_grpo.cli.console import Table, err, out, print_json, print_reward_note
from hpc_grpo.cli.eval_cmds import print_eval_rows
from hpc_grpo.cli.options import JsonT, RunT


def echo(chunks: Iterable[str]) -> bool:
    """Write a log's chunks to stdout as they come; whether anything came."""
    wrote = False
    for chunk in chunks:
        sys.stdout.write(chunk)
        sys.stdout.flush()
        wrote = True
    return wrote


def progress_line(p: Any) -> str:
    from rich.markup import escape  # the bar's [###---] would read as a markup tag

    from hpc_grpo.commands.monitor import bar, duration

    return (f"Progress: {escape(bar(p.step, p.total))}   {p.step_time_s or 0:.1f} s/step   ETA {duration(p.eta_s)}   "
            f"requeues {p.requeues}")


def print_hints(hints: list[str]) -> None:
    from rich.markup import escape

    for hint in hints:
        out.print(f"[yellow]hint:[/] {escape(hint)}")


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
    for acc in spec.accepted:
        from rich.markup import escape

        out.print(f"[yellow]accepted when the run was made (--accept {escape(acc.check)}):[/] {escape(acc.finding)}")
    for line in status.warnings:
        from rich.markup import escape

        out.print(f"[bold red]WARNING:[/] {escape(line)}")
    for failure in status.failures:
        out.print(f"[bold red]stopped:[/] {failure}")
    for problem in status.health:
        from rich.markup import escape

        out.print(f"[bold yellow]health:[/] {escape(problem)}")
    if status.trained:
        from rich.markup import escape

        out.print(f"[bold green]{escape(status.trained)}[/]")
    out.print(f"Last step: {status.last_step if status.last_step is not None else '-'}   complete checkpoints: "
              f"{status.complete_checkpoints}   newest: {status.newest_checkpoint or '-'}   time used: {status.time_used_s} s")
    for log in status.logs:
        out.print(f"log: {log}")


def print_monitor(mon: Any) -> None:
    p = mon.progress
    total = f"~{p.total}" if p.total and p.total_estimated else p.total
    out.print(progress_line(p) + (f"   (total {total}, estimated from the data)" if p.total_estimated else ""))
    if mon.latest:
        names = ("reward", "kl", "grad_norm", "response_length")
        out.print("Latest (step {}): ".format(mon.latest.get("step")) + "   ".join(
            f"{k} {mon.latest[k]:.4g}" if isinstance(mon.latest.get(k), float) else f"{k} -" for k in names))
    print_reward_note(mon.reward_note)
    out.print(f"[dim]metrics from {mon.source}[/]")
    print_hints(mon.hints)


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


def print_training_summary(run_dir: Path) -> None:
    from hpc_grpo.commands.watch import training_rows

    rows = training_rows(run_dir)
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


def wait_for(submission: Any, verbose: bool = False) -> int:
    """Follow a job to its end, echoing hpc-grpo's lines, the steps and errors of its log (verbose: all of it), then
    print the run's status and training summary; the exit code."""
    from hpc_grpo.commands.watch import console_lines, job_end, job_log

    if verbose:
        echo(job_log(submission))
    else:
        out.print(f"[dim]Following job {submission.job_id}: hpc-grpo's lines, the steps and errors (the whole log: "
                  f"{submission.log_hint}; --verbose prints it)[/]")
        echo(console_lines(job_log(submission)))
    end = job_end(submission)
    print_status(end.status)
    if verbose:  # else the step lines were shown as they came: the table would print them a second time
        print_training_summary(end.run_dir)
    else:
        out.print(f"Results: {end.run_dir}")
    if end.newest_eval:
        print_eval_rows(end.newest_eval)
    return 0 if end.ok else 1


def status(
    run: RunT = None,
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
        from hpc_grpo.commands.watch import progress_updates

        print_status(result)
        for progress, hints in progress_updates(run_dir, result.spec):
            out.print(progress_line(progress))
            print_hints(hints)
        raise typer.Exit(0)
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


def logs(
    run: RunT = None,
    follow: Annotated[bool, typer.Option("-f", "--follow", help="keep printing while the job runs")] = False,
    node: Annotated[int, typer.Option("--node", help="node index of the job (0: the driver's node)")] = 0,
    stderr: Annotated[bool, typer.Option("--err", help="the node's stderr log instead of stdout")] = False,
    job: Annotated[str | None, typer.Option("--job", help="job id (default: the run's newest job)")] = None,
) -> None:
    """Show or follow the driver's log, or one node's log, of a run's job."""
    from hpc_grpo.commands.logs import choose_log, job_log

    choice = choose_log(run, job, node, stderr)
    err.print(f"log: {choice.path}")
    if not echo(job_log(choice, follow)) and not choice.path.is_file():
        err.print("(no log yet: the job has not started)")
