"""`hpc-grpo eval` and `hpc-grpo eval-code`: what to score, where its results go, and the checks on the options.

lm-eval, torch and the generation stack are imported only inside the evaluation itself (a child process for
`eval`, hpc_grpo.evaluation.humaneval for `eval-code`), never by this module.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hpc_grpo.common.yamlio import SpecError

MODEL_RESULT = "eval.json"  # what `eval --model` writes into its output folder (hpc_grpo.job.eval_job)


def with_paths(results: list[dict[str, Any]], run_dir: Path) -> list[dict[str, Any]]:
    """The run's evaluation results, each given the "path" of its RUN/eval/step_N.json (the CLI prints it)."""
    from hpc_grpo.evaluation.evaluate import result_path

    for r in results:
        r["path"] = str(result_path(run_dir, r["step"]))
    return results


def results_with_paths(run_dir: Path) -> list[dict[str, Any]]:
    """Every evaluation of the run, by step, each with its path."""
    from hpc_grpo.evaluation.evaluate import load_results

    return with_paths(load_results(run_dir), run_dir)


def model_out_dir(model: Path, out_dir: Path | None) -> Path:
    """Where `eval --model` writes: --out, else ./eval-<model folder name>."""
    return out_dir or Path.cwd() / f"eval-{model.name}"


def run_eval(run: str | None, steps: list[int], all_kept: bool, tasks: list[str] | None, limit: int | None,
             here: bool | None) -> Any:
    """`hpc-grpo eval RUN`: its checkpoints scored here or queued as a job; the results carry their paths."""
    from hpc_grpo.commands.status import locate_run
    from hpc_grpo.evaluation import evaluate

    outcome = evaluate.eval_run(locate_run(run), steps, all_kept, tasks, limit, here)
    with_paths(outcome.results, outcome.run_dir)
    return outcome


def model_eval(model: Path, out_dir: Path | None, tasks: list[str] | None, limit: int | None,
               train_file: Path | None, test_file: Path | None, num_fewshot: int | None,
               max_gen_toks: int | None) -> Any:
    """`hpc-grpo eval --model PATH`: any Hugging Face folder scored here; the result carries its path."""
    from hpc_grpo.evaluation import evaluate

    folder = model_out_dir(model, out_dir)
    outcome = evaluate.eval_model(str(model), folder, tasks, limit, train_file and str(train_file),
                                  test_file and str(test_file), num_fewshot, max_gen_toks)
    for r in outcome.results:
        r["path"] = str(folder / MODEL_RESULT)
    return outcome


def check_code_options(run: str | None, model: str | None, k: list[int] | None, n: int) -> list[int]:
    """`eval-code`'s input checks, SpecError (exit 2): exactly one of a run and --model; each k between 1 and n.
    The pass@k values to report (default: 1)."""
    if (run is None) == (model is None):
        raise SpecError("eval-code: give a run (its name or folder) or --model (one of them)")
    ks = sorted(set(k or [1]))
    if any(x < 1 or x > n for x in ks):
        raise SpecError(f"--k {ks}: each k must be between 1 and --n={n}")
    return ks


def humaneval(run: str | None, model: str | None, json_out: Path | None, **opts: Any) -> dict[str, Any]:
    """`hpc-grpo eval-code` (options checked by check_code_options): a finished run's base model beside its policy,
    or one model folder; the report is also written to `json_out` when given. The sandbox's isolation (the run's
    grpo.code.isolation; auto for --model) is required before any model loads: SpecError (exit 2) where the node
    cannot give it, as the samples could not be scored here."""
    from hpc_grpo.evaluation.humaneval import evaluate_humaneval, evaluate_run
    from hpc_grpo.job import isolation

    run_dir = None
    setting = "auto"
    if run is not None:
        from hpc_grpo.commands.status import locate_run
        from hpc_grpo.config.resolve import load_frozen
        from hpc_grpo.runstate.runs import SPEC

        run_dir = locate_run(run)
        setting = load_frozen(run_dir / SPEC).recipe.grpo.code.isolation
    try:
        isolation.require(setting)
    except isolation.IsolationRefused as exc:
        raise SpecError(str(exc), key=isolation.KEY) from None
    if run_dir is not None:
        report = evaluate_run(run_dir, **opts)
    else:
        report = {"task": "humaneval", "models": [evaluate_humaneval(model, **opts)]}
    if json_out:
        json_out.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    return report
