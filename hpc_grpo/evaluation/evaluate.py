"""Evaluation after training, login-node side: what to evaluate, where the data is, the eval job, reading results.

Tasks: GSM8K (gsm8k, gsm8k_cot) through lm-eval on local files, HumanEval pass@1 (humaneval) through the training
reward's sandbox. A recipe that does not set eval.tasks evaluates what its reward trains (config.spec.default_eval_tasks:
code_exec -> humaneval, needing no GSM8K file; else gsm8k).
(Queuing the eval job is launch's: hpc_grpo.launch.submit.submit_eval; `hpc-grpo eval` is hpc_grpo.commands.eval.)

The evaluation runs as its own job (hpc_grpo/job/eval_job.py): on Slurm it is queued with
`--dependency=afterany:<training job>` and its own resources (recipe `eval.resources`: one node, e.g. one GPU for
vLLM), submitted from a clean environment so none of a surrounding job's SLURM_* variables leak into it; it
evaluates only if the run is trained (hpc_grpo.runstate.trained: train_done.json, or the final checkpoint of a job that
failed afterwards). On `cluster=local` the training job runs it itself, with the same check. Nothing here imports torch or lm_eval.

Files: RUN/eval/step_N.json (scores, settings, timing, one row per problem; prune's keep-best reads
`metrics["gsm8k/strict_match"]`), RUN/eval/tasks/ (the local lm-eval task definitions), RUN/exports/step_N/
(the merged HF model). Base-model scores are cached per model path and settings under
<runs root>/_base-evals/ (the runs root is shared by all nodes).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from collections.abc import Sequence
from typing import Any

from hpc_grpo.cluster import sbatch
from hpc_grpo.config import registry
from hpc_grpo.config.spec import Resources, RunSpec
from hpc_grpo.config.steps import KNOWN_ROWS
from hpc_grpo.common.yamlio import SpecError
from hpc_grpo.config import eval_tasks
from hpc_grpo.runstate import layout

GSM8K_TEST_ROWS = KNOWN_ROWS["gsm8k", "test"]  # published scores are over the whole test split
MODEL_RESULT = "eval.json"  # `hpc-grpo eval --model`: OUT/eval.json (a run's results: runstate.layout)
SOURCE_FILE = "source.json"  # written by `hpc-grpo data gsm8k`: where the raw question/answer files are
# Where users get GSM8K question/answer files: the product's own command, never a folder only its developers have.
GSM8K_RAW_HINT = (f"`hpc-grpo data gsm8k` writes them: from the Hub into ${registry.DATA_ENV} (default "
                  f"{registry.DEFAULT_DATA_ROOT})/gsm8k/raw/{{split}}.jsonl, "
                  "or --source DIR names your own DIR/{split}.jsonl")

# Published GSM8K scores of the instruct models (lm-eval gsm8k, as the Qwen2.5 blog of 2024-09 reports them).
PUBLISHED: dict[str, tuple[float, str]] = {
    "qwen2.5-0.5b-instruct": (49.6, "Qwen2.5 blog, 2024-09"),
    "qwen2.5-1.5b-instruct": (73.2, "Qwen2.5 blog, 2024-09"),
    "qwen2.5-3b-instruct": (86.7, "Qwen2.5 blog, 2024-09"),
    "qwen2.5-7b-instruct": (91.6, "Qwen2.5 blog, 2024-09"),
}
# After GRPO-LoRA with verl (verl docs/algo/baseline.md; verl's strict scorer, step 0 -> trained).
PUBLISHED_GRPO: dict[str, tuple[float, float, str]] = {
    "qwen2.5-3b-instruct": (56.3, 86.1, "verl docs/algo/baseline.md, GRPO-LoRA"),
    "qwen2.5-7b-instruct": (78.7, 93.4, "verl docs/algo/baseline.md, GRPO-LoRA"),
}


def published(model_path: str) -> dict[str, Any] | None:
    """GSM8K.md's numbers for a model, by its name (a Hub id or a folder named after it)."""
    key = Path(str(model_path).rstrip("/")).name.lower()
    if key not in PUBLISHED:
        return None
    score, source = PUBLISHED[key]
    out: dict[str, Any] = {"model": key, "gsm8k": score, "source": source}
    if key in PUBLISHED_GRPO:
        s0, s1, src = PUBLISHED_GRPO[key]
        out["grpo"] = {"step0": s0, "trained": s1, "source": src}
    return out


# ----------------------------------------------------------------------------------------- placement
@dataclass(frozen=True, slots=True)
class Placement:
    """Backend and GPUs of the evaluation: the one answer both the Slurm request (eval_spec) and lm-eval
    (settings_for -> scoring.build_args) read, so the job never asks for GPUs lm-eval leaves idle or the reverse."""

    backend: str  # "hf" | "vllm"
    gpus: int  # GPUs of the eval job's one node; lm-eval uses every one of them
    tp: int = 1  # vLLM tensor parallel size
    dp: int = 1  # vLLM data-parallel replicas: gpus == tp * dp

    @property
    def device(self) -> str:
        """Not a setting: it follows the GPUs, so hf can never be sent to cuda on a job without GPUs."""
        return "cuda" if self.gpus > 0 else "cpu"


def eval_resources(spec: RunSpec) -> Placement:
    """Decide backend and GPUs of a run's evaluation.

    Default: a GPU run (the training job has GPUs) evaluates GSM8K with vLLM on as many GPUs as one training node
    has, tensor parallel eval.tp else parallel.rollout_tp (the rollout already fits at that size), data-parallel
    replicas over the rest; a CPU run uses hf on the CPU. HumanEval generates with transformers (hf) on one GPU,
    so a run that evaluates only humaneval asks for one GPU, not the node. eval.backend and
    eval.resources.gpus_per_node win when set; settings that cannot all hold are a SpecError naming the key and
    the fix (plan reports it).
    """
    e = spec.recipe.eval
    train_gpus = spec.gpus_per_node
    lm_eval = bool(eval_tasks.lm_eval_tasks(e.tasks))  # only lm-eval's tasks run on vLLM
    if e.backend == "vllm" and not lm_eval:
        raise SpecError(f"eval.backend=vllm but no task of eval.tasks={list(e.tasks)} runs on vLLM (humaneval "
                        "generates with transformers on one GPU): leave eval.backend unset or set it to hf",
                        key="eval.backend")
    backend = e.backend or ("vllm" if train_gpus > 0 and lm_eval else "hf")
    asked = e.resources.gpus_per_node
    if backend == "hf":
        gpus = min(train_gpus, 1) if asked is None else asked
        if gpus > 1:
            raise SpecError(f"eval.resources.gpus_per_node={gpus} with eval.backend=hf: the hf backend (lm-eval's, and "
                            f"HumanEval's generation) runs on one GPU, so {gpus - 1} would sit idle; set eval.resources.gpus_per_node=1 (0: CPU) or "
                            "eval.backend=vllm to use them all", key="eval.resources.gpus_per_node")
        return Placement("hf", gpus)
    gpus = train_gpus if asked is None else asked
    if gpus < 1:
        why = "eval.resources.gpus_per_node=0" if asked is not None else "the training job has no GPUs"
        raise SpecError(f"eval.backend=vllm but the eval job has 0 GPUs ({why}): vLLM runs only on GPUs; set "
                        "eval.backend=hf to evaluate on the CPU, or eval.resources.gpus_per_node>=1",
                        key="eval.backend")
    tp = e.tp or spec.recipe.parallel.rollout_tp
    if gpus % tp:
        key = "eval.tp" if e.tp else "parallel.rollout_tp"
        raise SpecError(f"{key}={tp} does not divide the eval job's {gpus} GPU(s) (vLLM tensor parallel x "
                        f"data-parallel replicas must use them all): set eval.tp to a divisor of {gpus}, or "
                        f"eval.resources.gpus_per_node to a multiple of {tp}", key="eval.tp")
    return Placement("vllm", gpus, tp, gpus // tp)


# ------------------------------------------------------------------------------------------ settings
@dataclass(frozen=True, slots=True)
class EvalSettings:
    """What one evaluation runs: tasks, slice, backend; recorded in every result and in the base cache key."""

    tasks: tuple[str, ...]
    limit: int | None
    num_fewshot: int | None
    backend: str
    batch_size: int
    max_gen_toks: int | None
    train_file: str
    test_file: str
    tp: int = 1
    gpus: int = 0
    gpu_memory_utilization: float = 0.85
    dp: int = 1
    code_isolation: str = "auto"  # grpo.code.isolation: humaneval runs model code in the reward's sandbox

    def as_dict(self) -> dict[str, Any]:
        return {f: getattr(self, f) for f in self.__slots__}

    @property
    def placement(self) -> Placement:
        return Placement(self.backend, self.gpus, self.tp, self.dp)

    def cache_key(self, model_path: str) -> str:
        """Same model, same settings, same data files (by size and mtime) -> the same cached base scores."""
        data = {**self.as_dict(), "model": str(Path(model_path).resolve()) if Path(model_path).exists()
                else model_path, "data": [_file_id(self.train_file), _file_id(self.test_file)]}
        data.pop("gpu_memory_utilization")
        data.pop("code_isolation")  # where the code ran, not what was scored
        return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]


def _file_id(path: str) -> list[Any]:
    try:
        st = os.stat(path)
    except OSError:
        return [path, None, None]
    return [path, st.st_size, st.st_mtime_ns]


def data_files(spec: RunSpec, tasks: Sequence[str] | None = None) -> tuple[str, str]:
    """The train/test jsonl lm-eval reads for the tasks (eval.tasks by default; their registry entry names the rows
    and the `hpc-grpo data` command that writes them): eval.train_file/test_file, else the raw source that command
    recorded beside the prepared files (data/<...>/source.json) of the first of data.val_files."""
    e = spec.recipe.eval
    names = list(tasks or e.tasks)
    try:
        command = eval_tasks.data_command(names)
    except ValueError as exc:
        raise SpecError(str(exc), key="eval.tasks") from None
    task = eval_tasks.get(next(t for t in names if eval_tasks.get(t).data_command == command))
    train, test = e.train_file, e.test_file
    if train is None or test is None:
        src = _recorded_source(Path(spec.recipe.data.val_list[0]), command)
        if src is not None:
            train = train or str(src / "train.jsonl")
            test = test or str(src / "test.jsonl")
    if train is None or test is None:
        hint = GSM8K_RAW_HINT.format(split="test") if command == "gsm8k" else f"`hpc-grpo data {command}` writes them"
        raise SpecError(
            f"no {task.row_fields} files for lm-eval's {task.name}: data.val_files' first file "
            f"{spec.recipe.data.val_list[0]} has no {SOURCE_FILE} beside it (written by `hpc-grpo data {command}`); "
            f"set eval.test_file and eval.train_file to jsonl files with {task.row_fields} rows ({hint}, and "
            "train.jsonl beside it)", key="eval.test_file")
    return train, test


def _recorded_source(val_file: Path, command: str | None) -> Path | None:
    """The raw folder `hpc-grpo data <command>` recorded; a source.json of another command's data (it says which
    in "data") does not count. Older GSM8K source.json files name no command."""
    for folder in (val_file.parent, val_file.parent.parent):
        marker = folder / SOURCE_FILE
        if marker.is_file():
            try:
                recorded = json.loads(marker.read_text())
                raw = Path(recorded["raw_dir"])
            except (OSError, ValueError, KeyError, TypeError):
                return None
            if recorded.get("data", "gsm8k") != command:
                return None
            return raw if (raw / "test.jsonl").is_file() else None
    return None


def needs_files(tasks: Sequence[str]) -> bool:
    """Whether the tasks read local data files (lm-eval's do; humaneval ships its problems in its wheel)."""
    return eval_tasks.needs_files(tasks)


def settings_for(spec: RunSpec, tasks: list[str] | None = None, limit: int | None = None) -> EvalSettings:
    """What the eval job runs; backend and GPUs from eval_resources, the answer eval_spec asks Slurm for."""
    e = spec.recipe.eval
    train, test = data_files(spec, tasks) if needs_files(tasks or e.tasks) else ("", "")
    p = eval_resources(spec)
    return EvalSettings(tuple(tasks or e.tasks), limit if limit is not None else e.limit, e.num_fewshot, p.backend,
                        e.batch_size, e.max_gen_toks, train, test, p.tp, p.gpus, e.gpu_memory_utilization, p.dp,
                        spec.recipe.grpo.code.isolation)


def check_tasks(tasks: list[str]) -> list[str]:
    known = eval_tasks.names()
    bad = [t for t in tasks if t not in known]
    if bad or not tasks:
        raise SpecError(f"--tasks {','.join(tasks)}: unknown task(s) {', '.join(bad) or '(none given)'}; "
                        f"use {' or '.join(known)} (comma-separated)", key="tasks")
    return tasks


# ----------------------------------------------------------------------------------------- results
def load_results(run_dir: Path) -> list[dict[str, Any]]:
    """Every RUN/eval/step_N.json, by step."""
    found = []
    for _, path in layout.eval_results(run_dir):
        try:
            found.append(json.loads(path.read_text()))
        except (OSError, ValueError):
            continue
    return sorted(found, key=lambda r: r.get("step", 0))


def metrics_of(scores: dict[str, Any]) -> dict[str, float]:
    """Flat metric names, as logged to W&B (under eval/) and read by prune's keep-best."""
    out: dict[str, float] = {}
    for task, s in scores.items():
        keys = [k for k, _ in eval_tasks.get(task).metrics] if task in eval_tasks.names() else []
        for key in keys:
            if key in s:
                out[f"{task}/{key}"] = float(s[key])
    return out


def table_rows(result: dict[str, Any]) -> list[dict[str, Any]]:
    """Rows for the console table: the policy, its base model, and published numbers where known."""
    rows = []
    who = f"step {result['step']}" if result.get("step") is not None else "model"
    def row(what: str, model: str, task: str, s: dict[str, Any]) -> dict[str, Any]:
        labels = eval_tasks.get(task).metrics if task in eval_tasks.names() else ()
        return {"what": what, "model": model, "task": task, "n": s["n"], "strict": s.get("strict_match"),
                "flexible": s.get("flexible_extract"), "verl": s.get("verl_strict_reward"), "pass@1": s.get("pass@1"),
                "metrics": {label: s.get(key) for key, label in labels}}

    for task, s in result["scores"].items():
        rows.append(row(who, result["model"], task, s))
        base = (result.get("base") or {}).get("scores", {}).get(task)
        if base:
            rows.append(row("base", result["base"]["model"], task, base))
    pub = result.get("published")
    if pub:
        rows.append({"what": "published", "model": pub["model"], "task": "gsm8k", "n": GSM8K_TEST_ROWS,
                     "strict": None, "flexible": pub["gsm8k"] / 100, "verl": None, "source": pub["source"]})
        if "grpo" in pub:
            g = pub["grpo"]
            rows.append({"what": "published GRPO", "model": pub["model"], "task": "gsm8k (verl strict)", "n": GSM8K_TEST_ROWS,
                         "strict": None, "flexible": None, "verl": g["trained"] / 100, "source": g["source"]})
    return rows


# ------------------------------------------------------------------------------------------ the job
def job_argv(run_dir: Path, steps: list[int] | None = None, all_kept: bool = False, tasks: list[str] | None = None,
             limit: int | None = None, after: str | None = None) -> list[str]:
    """Arguments of `python -m hpc_grpo.job.eval_job` for a run; `after` (the training job it follows): evaluate
    only if the run is trained by then (hpc_grpo.runstate.trained)."""
    argv = ["--run", str(run_dir)]
    if after is not None:
        argv += ["--if-trained", "--after", str(after)]
    for step in steps or []:
        argv += ["--step", str(step)]
    if all_kept:
        argv.append("--all-kept")
    if tasks:
        argv += ["--tasks", ",".join(tasks)]
    if limit is not None:
        argv += ["--limit", str(limit)]
    return argv


def queued_after_training(spec: RunSpec) -> bool:
    """Whether `submit` queues the eval job on Slurm after the training job (so render writes its script): not on
    cluster=local (the training job evaluates itself) nor in chained mode, whose first job is not the last."""
    return spec.recipe.eval.runs and spec.cluster.scheduler == "slurm" and spec.cluster.restart != "chain"


def summary(spec: RunSpec) -> dict[str, Any]:
    """What the evaluation after training will run, for plan and submit to print: tasks, where it runs, its
    placement, and whether it reads GSM8K files. Placement errors are plan's findings (check_eval), not raised."""
    e = spec.recipe.eval
    out: dict[str, Any] = {"enabled": e.enabled, "tasks": list(e.tasks), "limit": e.limit,
                           "data_files": needs_files(e.tasks)}
    if not e.runs:
        out["where"] = e.skipped_why(spec.recipe.grpo.reward)
        return out
    if queued_after_training(spec):
        out["where"] = "a Slurm job queued afterany the training job (evaluates only if the run is trained)"
    elif spec.cluster.scheduler == "local":
        out["where"] = "in the training job, once training ended"
    else:
        out["where"] = ("not queued: cluster.restart=chain ends the first job by its time limit; "
                        "`hpc-grpo eval RUN` once the last job has finished")
    try:
        p = eval_resources(spec)
        out.update(backend=p.backend, gpus=p.gpus, device=p.device)
    except SpecError:
        pass
    return out


def describe(info: dict[str, Any]) -> str:
    """summary() in one line: 'humaneval (first 4 problems) on hf, cpu, 0 GPU(s): <where>'."""
    if not info["tasks"]:
        return str(info["where"])  # a reward with no eval task: the reason is the whole line
    what = ", ".join(info["tasks"]) + (f" (first {info['limit']} problems)" if info.get("limit") else "")
    if not info["enabled"]:
        return f"{what}: {info['where']}"
    on = f" on {info['backend']}, {info['device']}, {info['gpus']} GPU(s)" if "backend" in info else ""
    return f"{what}{on}: {info['where']}"


def eval_spec(spec: RunSpec) -> RunSpec:
    """The run's spec with the eval job's own resources (GPUs: eval_resources): the batch script is rendered from
    the same template."""
    e = spec.recipe.eval.resources
    res = Resources(nodes=1, gpus_per_node=eval_resources(spec).gpus, time=e.time, cpus_per_task=e.cpus_per_task, mem_gb=e.mem_gb,
                    partition=e.partition or spec.recipe.resources.partition,
                    account=e.account or spec.recipe.resources.account, qos=e.qos or spec.recipe.resources.qos)
    recipe = spec.recipe.model_copy(update={"resources": res})
    return spec.model_copy(update={"recipe": recipe, "run_name": f"{spec.run_name}-eval"})


class EvalJob:
    """The eval job's callable: runs `python -m hpc_grpo.job.eval_job ARGS` (the in-job side)."""

    def __init__(self, argv: list[str]) -> None:
        self.argv = list(argv)

    def __call__(self) -> int:
        import subprocess

        proc = subprocess.run([sys.executable, "-m", "hpc_grpo.job.eval_job", *self.argv], check=False)
        if proc.returncode != 0:
            run = self.argv[self.argv.index("--run") + 1] if "--run" in self.argv else ""
            raise RuntimeError(f"evaluation exited with status {proc.returncode} (its messages are above); "
                               f"checkpoints are untouched: run it again with `hpc-grpo eval {run}`")
        return 0


def dependency(after: str) -> str:
    """The eval job's dependency on training job `after`: afterany, not afterok. A training job that wrote its final
    checkpoint and then failed (W&B's teardown has done that) is trained, and afterok would never start the
    evaluation (its dependency can never be satisfied). Slurm keeps one job id across requeues and resolves the
    dependency at that job's final end; the eval job then decides itself (--if-trained, hpc_grpo.runstate.trained)."""
    return sbatch.dependency(sbatch.AFTER_ANY, after)


# ------------------------------------------------------------------------------------------- data
def default_data_files(command: str = "gsm8k") -> tuple[str, str] | None:
    """The raw files `hpc-grpo data <command>` recorded in its default output folder, if any."""
    root = registry.data_root() / command
    src = _recorded_source(root / "trl" / "test.jsonl", command)
    return (str(src / "train.jsonl"), str(src / "test.jsonl")) if src else None
