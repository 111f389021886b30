"""In-job side of the evaluation (GSM8K through lm-eval, HumanEval through the code sandbox): `python -m hpc_grpo.job.eval_job --run RUN_DIR [--step N | --all-kept]`
or `--model PATH [--out DIR]`.

Queued after a training job (`--if-trained --after JOB`: Slurm starts it `afterany` that job, whatever its end),
it first asks hpc_grpo.runstate.trained whether the run is trained (train_done.json, or its newest complete checkpoint at
the final step); if not it exits at once, and the history says why ("skipped").

For each chosen checkpoint: take a reader lease (prune leaves it alone), export it to RUN/exports/step_N/
(cached), score it with lm-eval's gsm8k / gsm8k_cot on local files, compute verl's strict reward on the same
generations, and write RUN/eval/step_N.json. The base model is scored once per model path and settings (cached
under the runs root) and shown beside; GSM8K.md's published numbers where the model is known. With W&B among the
run's loggers the scores go into the run's own W&B run (the id training used: runs.wandb_run_id) as eval/gsm8k/*.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from hpc_grpo.evaluation import evaluate, scoring
from hpc_grpo.runstate import layout, runs
from hpc_grpo.cluster.job_env import job_identity
from hpc_grpo.evaluation.evaluate import EvalSettings
from hpc_grpo.common.atomic import write_json_atomic
from hpc_grpo.config.spec import RunSpec
from hpc_grpo.config.eval_tasks import lm_eval_tasks


class EvalError(RuntimeError):
    """Nothing to evaluate, or a setting that cannot work; printed without a traceback."""


_T0 = time.monotonic()


def log(message: str) -> None:
    print(f"[hpc-grpo eval +{time.monotonic() - _T0:.1f}s] {message}", flush=True)


def score_model(model_dir: str | Path, settings: EvalSettings, task_dir: Path) -> dict[str, Any]:
    """One HF folder on every task: lm-eval's tasks (GSM8K, MATH) through lm-eval, humaneval through
    hpc_grpo.evaluation.humaneval (the training reward's sandboxed executor, pass@1); scores per task, timing and
    throughput."""
    lm_tasks = lm_eval_tasks(settings.tasks)
    result: dict[str, Any] = {"model": str(model_dir), "scores": {}, "wall_time_s": 0.0,
                              "settings": settings.as_dict()}
    if lm_tasks:
        scoring.write_task_dir(task_dir, lm_tasks, Path(settings.train_file), Path(settings.test_file))
        args = scoring.build_args(model_dir, lm_tasks, settings.placement, limit=settings.limit,
                                  num_fewshot=settings.num_fewshot, batch_size=settings.batch_size,
                                  max_gen_toks=settings.max_gen_toks,
                                  gpu_memory_utilization=settings.gpu_memory_utilization)
        log(f"lm-eval: {' '.join(args.cli(task_dir))}")
        raw = scoring.run_lm_eval(args, task_dir)
        result["scores"].update(raw["tasks"])
        result["wall_time_s"] += raw["wall_time_s"]
        result.update(lm_eval_version=raw["lm_eval_version"], lm_eval_cli=args.cli(task_dir))
    if "humaneval" in settings.tasks:
        from hpc_grpo.evaluation import humaneval
        from hpc_grpo.cluster import isolation

        try:
            log(isolation.job_line(settings.code_isolation))
        except isolation.IsolationRefused as exc:
            raise EvalError(str(exc)) from None
        t0 = time.time()
        log(f"humaneval: pass@1, {settings.limit or 'all'} problems, greedy")
        result["scores"].update(humaneval.task_scores(str(model_dir), limit=settings.limit,
                                                      max_new_tokens=settings.max_gen_toks or 512,
                                                      isolation=settings.code_isolation,
                                                      device=settings.placement.device,
                                                      batch_size=settings.batch_size))
        result["wall_time_s"] += time.time() - t0
    wall = result["wall_time_s"] = round(result["wall_time_s"], 3)
    n = sum(s["n"] for s in result["scores"].values())
    result["problems_per_s"] = round(n / wall, 4) if wall else None
    return result


def base_scores(model: str, settings: EvalSettings, cache_root: Path, task_dir: Path) -> dict[str, Any]:
    """The base model's scores, from the cache when the same model and settings were scored before."""
    path = layout.base_eval_file(cache_root, settings.cache_key(model))
    if path.is_file():
        try:
            cached = json.loads(path.read_text())
            log(f"base model scores from the cache: {path}")
            return cached
        except ValueError:
            pass
    log(f"scoring the base model {model}")
    result = score_model(model, settings, task_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path, result)
    return result


def choose(spec: RunSpec, steps: list[int], all_kept: bool) -> list[Any]:
    """The checkpoints to evaluate: --step N..., every complete one (--all-kept), or the newest complete one."""
    from hpc_grpo.runstate import checkpoints

    ckpts = checkpoints.list_checkpoints(spec.path, spec.recipe.engine)
    complete = [c for c in ckpts if c.complete]
    if steps:
        by_step = {c.step: c for c in ckpts}
        bad = [s for s in steps if s not in by_step or not by_step[s].complete]
        if bad:
            have = ", ".join(str(c.step) for c in complete) or "none"
            raise EvalError(f"--step {', '.join(map(str, bad))}: no complete checkpoint with that step "
                            f"(complete: {have})")
        return [by_step[s] for s in steps]
    if not complete:
        raise EvalError(f"run {spec.run_name} has no complete checkpoint in {layout.checkpoints_dir(spec.path)}")
    return complete if all_kept else [complete[-1]]


def base_model_path(spec: RunSpec) -> str:
    from hpc_grpo.job.trl_job import prepare_model

    return prepare_model(spec)


def evaluate_run(spec: RunSpec, steps: list[int], all_kept: bool, tasks: list[str] | None,
                 limit: int | None) -> list[Path]:
    from hpc_grpo.evaluation import export

    settings = evaluate.settings_for(spec, tasks, limit)
    if not settings.tasks:
        raise EvalError(f"nothing to evaluate: {spec.recipe.eval.skipped_why(spec.recipe.grpo.reward)}")
    run_dir = spec.path
    task_dir = layout.eval_tasks_dir(run_dir)
    base = base_model_path(spec)
    written = []
    chosen = choose(spec, steps, all_kept)  # before the base model is scored: nothing to do is said at once
    base_result = base_scores(base, settings, Path(spec.cluster.runs_root_path()), task_dir)
    for ckpt in chosen:
        t0 = time.time()
        with export.leased(run_dir, spec.recipe.engine, ckpt.step):  # prune leaves it (and its export) alone
            log(f"exporting step {ckpt.step} ({ckpt.layout}) from {ckpt.path}")
            folder = export.export_checkpoint(run_dir, ckpt.step, ckpt.path, ckpt.layout, base)
            export_s = time.time() - t0
            log(f"export ready: {folder} ({export.export_info(folder).get('how', '')})")
            result = score_model(folder, settings, task_dir)
        result.update({
            "run_name": spec.run_name, "step": ckpt.step, "checkpoint": str(ckpt.path), "export": str(folder),
            "export_s": round(export_s, 3), "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "metrics": evaluate.metrics_of(result["scores"]),
            "base": {"model": base, "scores": base_result["scores"]},
            "published": evaluate.published(spec.recipe.model.path),
        })
        out = layout.eval_result(run_dir, ckpt.step)
        out.parent.mkdir(parents=True, exist_ok=True)
        write_json_atomic(out, result)
        log(f"step {ckpt.step}: " + ", ".join(f"{k} {v:.4f}" for k, v in result["metrics"].items()) + f" -> {out}")
        log_wandb(spec, result)
        written.append(out)
    return written


def log_wandb(spec: RunSpec, result: dict[str, Any]) -> None:
    """eval/gsm8k/* into the run's own W&B run (the same id training used, runs.wandb_run_id)."""
    if "wandb" not in spec.recipe.logging.logger:
        return
    from hpc_grpo.job.trl_job import wandb_env

    os.environ.update(wandb_env(spec))
    import wandb

    run = wandb.init(id=runs.wandb_run_id(spec.path), resume="allow", project=spec.recipe.logging.project, dir=spec.run_dir,
                     name=spec.recipe.logging.experiment or spec.run_name)
    try:
        run.define_metric("eval/step")
        run.define_metric("eval/*", step_metric="eval/step")
        run.log({"eval/step": result["step"], **{f"eval/{k}": v for k, v in result["metrics"].items()},
                 "eval/problems_per_s": result["problems_per_s"]})
    finally:
        run.finish()


def evaluate_model(model: str, out: Path | None, tasks: list[str] | None, limit: int | None,
                   train_file: str, test_file: str, backend: str = "hf", num_fewshot: int | None = None,
                   max_gen_toks: int | None = None) -> Path:
    """Any HF folder (e.g. the base model): scores, published numbers, JSON in OUT/eval.json."""
    settings = EvalSettings(tuple(tasks or ["gsm8k"]), limit, num_fewshot, backend, 8, max_gen_toks,
                            train_file, test_file)
    out = out or Path.cwd() / "eval-model"
    out.mkdir(parents=True, exist_ok=True)
    result = score_model(model, settings, out / layout.EVAL_TASKS_DIR)
    result.update({"step": None, "metrics": evaluate.metrics_of(result["scores"]),
                   "published": evaluate.published(model), "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")})
    path = out / evaluate.MODEL_RESULT
    write_json_atomic(path, result)
    log(", ".join(f"{k} {v:.4f}" for k, v in result["metrics"].items()) + f" -> {path}")
    return path


def trained_gate(spec: RunSpec, after: str | None) -> Any:
    """The verdict of hpc_grpo.runstate.trained for a run this job was queued after. Live training jobs other than this one
    and the one it follows (Slurm said that one ended) mean the run is still going."""
    from hpc_grpo.runstate import trained

    own, _ = job_identity()
    evals = {e.job_id for e in runs.read_history(spec.path) if e.purpose == "eval"}
    try:
        live = runs.live_jobs(spec.path)
    except Exception as exc:  # noqa: BLE001 - Slurm unreachable: judge from the disk alone, and say so
        log(f"could not ask Slurm which jobs are live ({exc}); judging from the run directory only")
        live = {}
    others = {j: st for j, st in live.items() if j not in evals and j not in (own, after)}
    return trained.decide(spec, others)


def skip_untrained(spec: RunSpec, after: str | None) -> bool:
    """True (and a "skipped" history line) when the run is not trained: nothing is evaluated then."""
    verdict = trained_gate(spec, after)
    if verdict.trained:
        log(f"run {spec.run_name} is trained: {verdict.reason}")
        return False
    job, executor = job_identity()
    note = (f"evaluation skipped: {verdict.reason}" + (f" (training job {after} has ended)" if after else "")
            + f"; evaluate by hand once trained: hpc-grpo eval {spec.run_dir}")
    runs.append_history(spec.path, job, "skipped", executor, note=note, data={"after": after})
    log(note)
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hpc_grpo.job.eval_job", description=__doc__.split("\n")[0])
    parser.add_argument("--run", type=Path, help="run directory")
    parser.add_argument("--step", type=int, action="append", default=[], help="checkpoint step (repeatable)")
    parser.add_argument("--all-kept", action="store_true", help="every complete checkpoint")
    parser.add_argument("--tasks", default=None, help="gsm8k,gsm8k_cot")
    parser.add_argument("--limit", type=int, default=None, help="first K test problems")
    parser.add_argument("--model", default=None, help="evaluate this HF folder instead of a run")
    parser.add_argument("--out", type=Path, default=None, help="with --model: output folder")
    parser.add_argument("--train-file", default=None)
    parser.add_argument("--test-file", default=None)
    parser.add_argument("--num-fewshot", type=int, default=None)
    parser.add_argument("--max-gen-toks", type=int, default=None)
    parser.add_argument("--if-trained", action="store_true",
                        help=f"evaluate only if the run is trained ({layout.DONE_FILE} or its final checkpoint)")
    parser.add_argument("--after", default=None, help="with --if-trained: the training job this job was queued after")
    args = parser.parse_args(argv)
    from hpc_grpo.config.resolve import load_frozen
    from hpc_grpo.evaluation.export import ExportError
    from hpc_grpo.common.yamlio import SpecError

    tasks = evaluate.check_tasks(args.tasks.split(",")) if args.tasks else None
    try:
        if args.model:
            if evaluate.needs_files(tasks or ["gsm8k"]) and not (args.train_file and args.test_file):
                raise EvalError("--model needs --train-file and --test-file (GSM8K question/answer jsonl)")
            evaluate_model(args.model, args.out, tasks, args.limit, args.train_file or "", args.test_file or "",
                           num_fewshot=args.num_fewshot, max_gen_toks=args.max_gen_toks)
        else:
            if args.run is None:
                raise EvalError("give --run RUN_DIR or --model PATH")
            spec = load_frozen(layout.spec_file(args.run))
            if args.if_trained and skip_untrained(spec, args.after):
                return 0
            evaluate_run(spec, args.step, args.all_kept, tasks, args.limit)
    except (EvalError, SpecError, FileNotFoundError, ExportError) as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
