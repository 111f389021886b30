"""`hpc-grpo eval`: score a run's checkpoints (here, or as a Slurm job queued afterany a live training job) or any
Hugging Face model folder. The evaluation itself runs in a child process (`python -m hpc_grpo.job.eval_job`), so this
process never imports torch or lm_eval; what to evaluate and where the data is come from hpc_grpo.evaluation.evaluate.
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
from hpc_grpo.launch.submit import submit_eval
from hpc_grpo.runstate import runs
from hpc_grpo.evaluation.evaluate import (
    GSM8K_RAW_HINT,
    check_tasks,
    data_files,
    default_data_files,
    job_argv,
    load_results,
    needs_gsm8k,
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
    spec = load_frozen(run_dir / runs.SPEC)
    if tasks:
        check_tasks(tasks)
    if needs_gsm8k(tasks or spec.recipe.eval.tasks):
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
    if not needs_gsm8k(tasks or ["gsm8k"]):
        train_file, test_file = "", ""
    elif not (train_file and test_file):
        found = default_data_files()
        if found is None:
            raise SpecError("no GSM8K files: pass --test-file and --train-file (question/answer jsonl: "
                            f"{GSM8K_RAW_HINT.format(split='test')})", key="test-file")
        train_file, test_file = train_file or found[0], test_file or found[1]
    for f in (train_file, test_file) if needs_gsm8k(tasks or ["gsm8k"]) else ():
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
    return EvalOutcome(None, True, [json.loads((out / "eval.json").read_text())])
