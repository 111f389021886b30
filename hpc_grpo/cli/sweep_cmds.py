"""`hpc-grpo sweep` and `hpc-grpo sweep status SWEEP`: several settings of a recipe as one Slurm job array, and
where each member stands. The logic is hpc_grpo.commands.sweep; `resume SWEEP` is ckpt_cmds.resume's."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from hpc_grpo.cli.console import err, out, print_json, print_rows
from hpc_grpo.cli.options import JsonT, NameT, SchemaT, parse_args, pick_cluster
from hpc_grpo.cli.run_cmds import BudgetT, escape_text, wandb_run

SweepArgsT = Annotated[list[str] | None, typer.Argument(
    help="recipe=NAME [cluster=NAME] [key=value ...] with axes key=[a,b,...]; or: status SWEEP", show_default=False)]


def sweep(
    args: SweepArgsT = None,
    random_k: Annotated[int | None, typer.Option("--random", help="K members drawn from the grid, not all of it")] = None,
    seed: Annotated[int, typer.Option("--seed", help="the seed of --random's draw")] = 0,
    parallel: Annotated[int, typer.Option("--parallel", help="members running at once (the array's %P)")] = 2,
    metric: Annotated[str, typer.Option("--metric", help="what `sweep status` ranks the members by (a key the "
                                        "engine logs, e.g. reward)")] = "reward",
    mode: Annotated[str, typer.Option("--mode", help="max or min: which end of --metric is best")] = "max",
    rungs: Annotated[str | None, typer.Option("--rungs", help="successive halving: the steps (e.g. 4,8) at which a "
                                               "member goes on only within the top 1/eta by --metric")] = None,
    eta: Annotated[int, typer.Option("--eta", help="successive halving: keep the top 1/eta at each rung")] = 2,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="plan every member and print them; queue nothing")] = False,
    name: NameT = None,
    schema: SchemaT = True,
    as_json: JsonT = False,
    budget: BudgetT = None,
) -> None:
    """Sweep a recipe over listed values (key=[a,b]) as one Slurm job array, each member an ordinary run.

    Every member is planned before anything is queued; `sweep status SWEEP` shows the members."""
    items = list(args or [])
    if items and items[0] == "status":
        if len(items) != 2:
            raise typer.BadParameter("give one sweep: hpc-grpo sweep status SWEEP")
        sweep_status(items[1], as_json)
        return
    from hpc_grpo.commands.sweep import plan_sweep, submit_sweep

    recipe, cluster, overrides = parse_args(items)
    plan = plan_sweep(recipe, pick_cluster(cluster), overrides, name, random_k, seed, parallel, schema=schema,
                      metric=metric, mode=mode, rungs=parse_rungs(rungs), eta=eta)
    for note in plan.notes:
        err.print(note, markup=False, highlight=False)
    m = plan.manifest
    out.print(f"[bold]Sweep {m.name}[/]: {len(m.members)} members ({m.how}) of recipe {m.recipe} on {m.cluster}, "
              f"{m.parallel} at a time -> {plan.folder}")
    if m.rungs:
        out.print(f"Successive halving at steps {', '.join(map(str, m.rungs))}: a member goes on only within the top "
                  f"1/{m.eta} by {m.metric} ({m.mode}) of the members that reached the rung before it")
    wb = wandb_run(plan.specs[0])
    if wb is not None:
        out.print(f"W&B: every member's run joins group {wb['group']} (project {wb['project']})", markup=False,
                  highlight=False)
    print_rows("Members (each planned)", ("#", "run", "overrides", "cost"),
               [(str(x.index), x.name, " ".join(x.overrides), _gpu_hours(p.cost)) for x, p in zip(m.members, plan.plans)])
    from hpc_grpo.planning.cost import BUDGET_FIGURE, SweepCost, check_budget

    cost = SweepCost([(x.name, p.cost) for x, p in zip(m.members, plan.plans)], m.rungs, m.eta)
    out.print(f"Cost: {escape_text(cost.describe())}")
    if budget is not None:
        check_budget(cost.members, budget, what=f"sweep {m.name}", expected=cost.expected if m.rungs else None)
        out.print(f"Budget: --budget-gpu-hours {budget:g} is checked against {BUDGET_FIGURE}")
    if dry_run:
        out.print("Dry run: nothing written or queued.")
        return
    subs = submit_sweep(plan)
    array = subs[0].job_id.split("_", 1)[0]
    out.print(f"Job array: {array} ({len(subs)} tasks, %{m.parallel}); eval jobs: "
              + (", ".join(s.eval.job_id for s in subs if s.eval is not None) or "none"))
    out.print(f"Follow it: hpc-grpo sweep status {m.name}    resume the unfinished: hpc-grpo resume {m.name}")


def parse_rungs(text: str | None) -> list[int]:
    if not text:
        return []
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        from hpc_grpo.common.yamlio import SpecError

        raise SpecError(f"--rungs {text!r}: steps separated by commas, e.g. --rungs 4,8", key="--rungs") from None


def _gpu_hours(cost: Any) -> str:
    gh = None if cost is None else cost.gpu_hours
    return "?" if gh is None else f"{gh:.1f} GPU-h"


def _fmt(value: Any) -> str:
    return "-" if value is None else f"{value:.4g}" if isinstance(value, float) else str(value)


def sweep_status(name: str, as_json: bool) -> None:
    from hpc_grpo.commands.sweep import locate_sweep
    from hpc_grpo.commands.sweep import sweep_status as status_of

    folder = locate_sweep(name)
    manifest, rows = status_of(folder)
    if as_json:
        print_json({"sweep": manifest.name, "folder": str(folder), "recipe": manifest.recipe,
                    "cluster": manifest.cluster, "how": manifest.how, "parallel": manifest.parallel,
                    "metric": manifest.metric, "mode": manifest.mode, "rungs": manifest.rungs, "eta": manifest.eta,
                    "arrays": manifest.arrays,
                    "members": [r.as_dict() for r in rows]})
        return
    out.print(f"[bold]Sweep {manifest.name}[/]: {len(rows)} members ({manifest.how}), arrays "
              + ", ".join(f"{a['job_id']} ({a['purpose']})" for a in manifest.arrays) + f"; {folder}")
    best = [(r.best, r.index) for r in rows if r.best is not None]
    top = (max if manifest.mode == "max" else min)(best)[1] if best else None
    print_rows(f"Members (best {manifest.metric}, {manifest.mode})",
               ("#", "overrides", "state", "job", "step", f"best {manifest.metric}", "why stopped"),
               [(("*" if r.index == top else "") + str(r.index), " ".join(r.overrides), r.state, _fmt(r.job_id),
                 _fmt(r.step), _fmt(r.best) + (f" @{r.best_step}" if r.best_step is not None else ""), r.stopped)
                for r in rows])
