"""`hpc-grpo eval`, `eval-code` and `report`: scores and curves of a run, printed. What is scored where, and the
checks on the options, are in hpc_grpo.commands.eval and hpc_grpo.commands.report."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from hpc_grpo.cli.console import Table, err, out, print_json
from hpc_grpo.cli.options import JsonT, RunT
from hpc_grpo.runstate import layout
from hpc_grpo.runstate.layout import REPORT_FILE

StepT = Annotated[list[int] | None, typer.Option("--step", help="checkpoint step (repeatable; default: newest)")]


def short_model(model: str, run_dir: Path | None) -> str:
    """A model path as the eval table shows it: relative to the run directory where it is inside it
    (exports/step_24), else with ~ for the home folder, so the table fits 80 columns."""
    path = Path(model)
    if run_dir is not None and path.is_relative_to(run_dir):
        return str(path.relative_to(run_dir))
    home = Path.home()
    return f"~/{path.relative_to(home)}" if path.is_absolute() and path.is_relative_to(home) else model


def print_eval_rows(results: list[dict[str, Any]]) -> None:
    """One table per evaluation: policy, base and published rows; only the score columns some row has, model paths
    relative to the run directory (the table fits 80 columns)."""
    from hpc_grpo.evaluation.evaluate import table_rows

    def pct(v: Any) -> str:
        return "-" if v is None else f"{v:.1%}"

    for result in results:
        run_dir = Path(result["path"]).parent.parent if result.get("path") else None
        name = result.get("run_name") or (run_dir.name if run_dir is not None else short_model(result["model"], None))
        rows = table_rows(result)
        # One task (a published row's "gsm8k (verl strict)" is gsm8k): it goes in the title, not in a column.
        tasks = {r["task"].split(" (")[0] for r in rows}
        one_task = len(tasks) == 1
        t = Table(title=f"Evaluation: {name}" + (f", {rows[0]['task']}" if one_task else ""))
        fixed = {"strict": "strict", "flexible": "flexible", "verl": "verl strict", "pass@1": "pass@1"}
        extra = list(dict.fromkeys(k for r in rows for k in r.get("metrics", {}) if k not in fixed.values()))
        scores = [k for k in fixed if any(r.get(k) is not None for r in rows)]
        for col in ("", "model", *(() if one_task else ("task",)), "n"):
            t.add_column(col, overflow="fold")
        for col in (*(fixed[k] for k in scores), *extra):
            t.add_column(col, overflow="fold", max_width=8)  # "100.0%"; a long header wraps, the model keeps room
        for row in rows:
            t.add_row(row["what"], short_model(row["model"], run_dir), *(() if one_task else (row["task"],)),
                      str(row["n"]), *(pct(row.get(k)) for k in scores),
                      *(pct(row.get("metrics", {}).get(k)) for k in extra))
        out.print(t)
        rate = result.get("problems_per_s")
        out.print(f"wall time {result['wall_time_s']:.1f} s, {rate if rate is not None else '-'} problems/s; "
                  f"results: {result.get('path', '')}")


def eval_json(outcome: Any) -> dict[str, Any]:
    """`eval --json`: the outcome with every result's scores, without the per-problem samples."""
    return {"ran_here": outcome.ran_here, "job_id": outcome.job_id, "after": outcome.after,
            "results": [{k: v for k, v in r.items() if k != "scores"} | {"scores": {
                t: {k: v for k, v in s.items() if k != "samples"} for t, s in r["scores"].items()}}
                for r in outcome.results]}


def eval_cmd(
    run: RunT = None,
    step: StepT = None,
    all_kept: Annotated[bool, typer.Option("--all-kept", help="every complete checkpoint")] = False,
    tasks: Annotated[str | None, typer.Option("--tasks", help="gsm8k,gsm8k_cot,humaneval (default: the recipe's)")] = None,
    limit: Annotated[int | None, typer.Option("--limit", min=1, help="first K test problems")] = None,
    model: Annotated[Path | None, typer.Option("--model", help="evaluate this HF model folder instead")] = None,
    out_dir: Annotated[Path | None, typer.Option("--out", help="with --model: output folder")] = None,
    here: Annotated[bool | None, typer.Option("--here/--submit", help="run in this shell or as a Slurm job "
                                                 "(default: here on cluster=local)")] = None,
    test_file: Annotated[Path | None, typer.Option("--test-file", help="with --model: GSM8K test jsonl")] = None,
    train_file: Annotated[Path | None, typer.Option("--train-file", help="with --model: GSM8K train jsonl")] = None,
    num_fewshot: Annotated[int | None, typer.Option("--num-fewshot", min=0, help="with --model")] = None,
    max_gen_toks: Annotated[int | None, typer.Option("--max-gen-toks", min=1, help="with --model")] = None,
    as_json: JsonT = False,
) -> None:
    """Score a run's checkpoint(s) on its eval.tasks (GSM8K with lm-eval, HumanEval pass@1 in the sandbox) beside
    the base model, or any model with --model."""
    from hpc_grpo.commands.eval import model_eval, run_eval

    task_list = [t for t in tasks.split(",") if t] if tasks else None
    if model is not None:
        outcome = model_eval(model, out_dir, task_list, limit, train_file, test_file, num_fewshot, max_gen_toks)
    else:
        outcome = run_eval(run, list(step or []), all_kept, task_list, limit, here)
    if as_json:
        print_json(eval_json(outcome))
        return
    if not outcome.ran_here:
        from hpc_grpo.evaluation.evaluate import dependency

        dep = f" ({dependency(outcome.after)}, evaluates only if the run is trained)" if outcome.after else ""
        out.print(f"Eval job {outcome.job_id}{dep} queued; log: {outcome.log}")
        from hpc_grpo.runstate.layout import eval_dir

        out.print(f"Results will be in {eval_dir(outcome.run_dir)}, one file per step; see them with: "
                  f"hpc-grpo report {outcome.run_dir}")
        return
    print_eval_rows(outcome.results)


def report(
    run: RunT = None,
    png: Annotated[Path | None, typer.Option(
        "--png", help=f"where to write the figure (default: RUN/{REPORT_FILE})")] = None,
    as_json: JsonT = False,
    calibrate: Annotated[bool, typer.Option(
        "--calibrate", help="record this run's measured step time and start-up as its cluster's calibration for "
        "its engine: plan then predicts that cluster's runs from it")] = False,
) -> None:
    """Training curves (reward, KL, response length, entropy), accuracy per step, and the step and wall time
    measured beside predicted: a PNG and a summary. Given a sweep, its members' reward and metric curves
    overlaid, the best marked."""
    from hpc_grpo.commands import report as report_mod
    from hpc_grpo.commands.status import locate_run
    from hpc_grpo.commands.sweep import is_sweep, locate_sweep

    if run is not None and is_sweep(run):
        folder = locate_sweep(run)
        srep = report_mod.build_sweep(folder)
        path = report_mod.draw_sweep(srep, png or layout.report_file(folder))
        if as_json:
            print_json({**srep.as_dict(), "figure": str(path)})
            return
        for line in srep.summary():
            out.print(line, markup=False, highlight=False)
        out.print(f"Figure: {path}")
        return
    from hpc_grpo.commands.run_timing import run_timing

    run_dir = locate_run(run)
    rep = report_mod.build(run_dir)
    path = report_mod.draw(rep, report_mod.figure_path(run_dir, png))
    timing = run_timing(run_dir)
    if as_json:
        print_json({"run": rep.run_name, "source": rep.source, "curves": rep.steps, "evals": rep.evals,
                    "timing": None if timing is None else timing.as_dict(), "figure": str(path)})
    else:
        for line in [*rep.summary(), *([] if timing is None else timing.lines())]:
            out.print(line, markup=False, highlight=False)
        out.print(f"Figure: {path}")
    if calibrate:
        record_calibration(run_dir)


def record_calibration(run_dir: Path) -> None:
    from hpc_grpo.commands.run_timing import calibrate

    where, cal = calibrate(run_dir)
    err.print(f"calibration recorded in {where}: {cal.engine} on {cal.cluster}, {cal.step_s:.3g} s/step measured "
              f"against {cal.model_step_s:.3g} s modelled (x{cal.scale:.3g}); plan predicts this cluster's "
              f"{cal.engine} runs from it")


def eval_code(
    run: Annotated[str | None, typer.Argument(help="a finished run's name or folder: its base model and its "
                                                 "trained policy")] = None,
    model: Annotated[str | None, typer.Option(help="evaluate this model folder instead of a run")] = None,
    limit: Annotated[int | None, typer.Option(help="first N HumanEval problems (default: all 164)")] = None,
    n: Annotated[int, typer.Option(help="samples per problem (sampled when > 1)")] = 1,
    k: Annotated[list[int] | None, typer.Option(help="pass@k to report (k <= n; repeatable)")] = None,
    max_new_tokens: Annotated[int, typer.Option(help="tokens per sample")] = 512,
    temperature: Annotated[float, typer.Option(help="sampling temperature when n > 1")] = 0.8,
    json_out: Annotated[Path | None, typer.Option("--json-out", help="also write the report here")] = None,
) -> None:
    """HumanEval pass@1 / pass@k through the sandboxed executor, base model beside the policy of a run."""
    from hpc_grpo.commands.eval import check_code_options, humaneval

    ks = check_code_options(run, model, k, n)
    report = humaneval(run, model, json_out, limit=limit, n=n, ks=ks, max_new_tokens=max_new_tokens,
                       temperature=temperature)
    t = Table(title="HumanEval")
    for col in ("model", "problems", "n", *[f"pass@{x}" for x in ks], "outcomes"):
        t.add_column(col)
    for m in report["models"]:
        t.add_row(m["label"], str(m["problems"]), str(m["n"]), *[f"{m.get(f'pass@{x}', float('nan')):.3f}" for x in ks],
                  " ".join(f"{kk}={v}" for kk, v in sorted(m["outcomes"].items())))
    out.print(t)
