"""`hpc-grpo eval` and `hpc-grpo eval-code`: what to score, where its results go, and the checks on the options.

lm-eval, torch and the generation stack are imported only inside the evaluation itself (a child process for
`eval`, hpc_grpo.evaluation.humaneval for `eval-code`), never by this module.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hpc_grpo.common.yamlio import SpecError
from hpc_grpo.config.resolve import load_frozen
from hpc_grpo.config import eval_tasks
from hpc_grpo.launch.submit import submit_eval
from hpc_grpo.runstate import layout, runs
from hpc_grpo.evaluation.evaluate import (
    GSM8K_RAW_HINT,
    MODEL_RESULT,
    check_tasks,
    data_files,
    default_data_files,
    job_argv,
    load_results,
    needs_files,
)


@dataclass
class EvalOutcome:
    """What `hpc-grpo eval` did: ran here (results) or queued a job (job id, log)."""

    run_dir: Path | None
    ran_here: bool
    results: list[dict[str, Any]]
    job_id: str | None = None
    log: str | None = None
    after: str | None = None


def run_here(argv: list[str]) -> None:
    """The in-job code, in a child process of this one (so the CLI itself never imports torch or lm_eval)."""
    proc = subprocess.run([sys.executable, "-m", "hpc_grpo.job.eval_job", *argv], check=False)
    if proc.returncode != 0:
        raise SpecError(f"the evaluation failed (exit {proc.returncode}); its messages are above", key="eval") \
            if proc.returncode == 2 else RuntimeError(f"the evaluation failed (exit {proc.returncode})")


def eval_run(run_dir: Path, steps: list[int], all_kept: bool, tasks: list[str] | None, limit: int | None,
             here: bool | None = None) -> EvalOutcome:
    """Evaluate a run's checkpoints: here on cluster=local (or --here), else as a Slurm job (afterany a live
    training job, if there is one)."""
    if steps and all_kept:
        raise SpecError("--step and --all-kept exclude each other: give one", key="step")
    spec = load_frozen(layout.spec_file(run_dir))
    if tasks:
        check_tasks(tasks)
    elif not spec.recipe.eval.tasks:
        raise SpecError(f"{run_dir} has no eval task to run: its grpo.reward={spec.recipe.grpo.reward} names none and "
                        "its eval.tasks is empty; name the tasks with --tasks (one or more of "
                        f"{', '.join(eval_tasks.names())})", key="tasks")
    if needs_files(tasks or spec.recipe.eval.tasks):
        data_files(spec)  # a missing data file is an input error now, not a failed job later
    argv = job_argv(run_dir, steps, all_kept, tasks, limit)
    if here is None:
        here = spec.cluster.scheduler == "local"
    if here:
        before = {r.get("step"): r.get("finished_at") for r in load_results(run_dir)}
        run_here(argv)
        fresh = [r for r in load_results(run_dir) if before.get(r.get("step")) != r.get("finished_at")]
        return EvalOutcome(run_dir, True, fresh)
    live = runs.live_jobs(run_dir)
    train = [e.job_id for e in runs.read_history(run_dir) if e.purpose != "eval" and e.job_id in live]
    after = train[-1] if train else None
    if after:
        argv = job_argv(run_dir, steps, all_kept, tasks, limit, after=after)
    sub = submit_eval(spec, argv, after=after)
    return EvalOutcome(run_dir, False, [], sub.job_id, sub.log_hint, after)


def eval_model(model: str, out: Path, tasks: list[str] | None, limit: int | None, train_file: str | None,
               test_file: str | None, num_fewshot: int | None, max_gen_toks: int | None) -> EvalOutcome:
    """`hpc-grpo eval --model PATH`: any HF folder (the base model, an export), scored here."""
    if tasks:
        check_tasks(tasks)
    if not needs_files(tasks or ["gsm8k"]):
        train_file, test_file = "", ""
    elif not (train_file and test_file):
        found = default_data_files()
        if found is None:
            raise SpecError("no GSM8K files: pass --test-file and --train-file (question/answer jsonl: "
                            f"{GSM8K_RAW_HINT.format(split='test')})", key="test-file")
        train_file, test_file = train_file or found[0], test_file or found[1]
    for f in (train_file, test_file) if needs_files(tasks or ["gsm8k"]) else ():
        if not Path(f).is_file():
            raise SpecError(f"{f} does not exist: pass a GSM8K jsonl with question/answer rows", key="test-file")
    if not (Path(model) / "config.json").is_file():
        raise SpecError(f"--model {model}: no config.json there; pass a Hugging Face model folder", key="model")
    argv = ["--model", str(model), "--out", str(out)]
    if train_file and test_file:
        argv += ["--train-file", str(train_file), "--test-file", str(test_file)]
    if tasks:
        argv += ["--tasks", ",".join(tasks)]
    for flag, value in (("--limit", limit), ("--num-fewshot", num_fewshot), ("--max-gen-toks", max_gen_toks)):
        if value is not None:
            argv += [flag, str(value)]
    run_here(argv)
    return EvalOutcome(None, True, [json.loads((out / MODEL_RESULT).read_text())])



def with_paths(results: list[dict[str, Any]], run_dir: Path) -> list[dict[str, Any]]:
    """The run's evaluation results, each given the "path" of its RUN/eval/step_N.json (the CLI prints it)."""
    for r in results:
        r["path"] = str(layout.eval_result(run_dir, r["step"]))
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

    run_dir = locate_run(run)
    outcome = eval_run(run_dir, steps, all_kept, tasks, limit, here)
    with_paths(outcome.results, run_dir)
    return outcome


def model_eval(model: Path, out_dir: Path | None, tasks: list[str] | None, limit: int | None,
               train_file: Path | None, test_file: Path | None, num_fewshot: int | None,
               max_gen_toks: int | None) -> Any:
    """`hpc-grpo eval --model PATH`: any Hugging Face folder scored here; the result carries its path."""
    folder = model_out_dir(model, out_dir)
    outcome = eval_model(str(model), folder, tasks, limit, str(train_file) if train_file else None,
                         str(test_file) if test_file else None, num_fewshot, max_gen_toks)
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
    from hpc_grpo.cluster import isolation

    run_dir = None
    setting = "auto"
    if run is not None:
        from hpc_grpo.commands.status import locate_run
        from hpc_grpo.config.resolve import load_frozen

        run_dir = locate_run(run)
        setting = load_frozen(layout.spec_file(run_dir)).recipe.grpo.code.isolation
    try:
        isolation.require(setting)
    except isolation.IsolationRefused as exc:
        raise SpecError(str(exc), key=isolation.KEY) from None
    if run_dir is not None:
        report = evaluate_run(run_dir, **opts)
    elif model is not None:
        report = {"task": "humaneval", "models": [evaluate_humaneval(model, **opts)]}
    else:
        raise SpecError("eval-code needs a run or --model PATH", key="model")
    if json_out:
        json_out.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    return report
