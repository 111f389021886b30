"""Scoring with lm-evaluation-harness's own task definitions, offline, on local files (GSM8K, MATH).

lm-eval's YAMLs (hpc_grpo/config/eval_tasks.py names each task's) are not copied: a local task file `include:`s the
installed one and only swaps the Hub dataset for local jsonl files (GSM8K's question/answer rows, MATH's
problem/solution rows). So prompts, few-shot examples, stop sequences and filters are exactly what papers use.
Backends: `hf` (CPU or one GPU) and `vllm` (GPU nodes: tensor parallel x data-parallel replicas over the eval
node's GPUs) behind one `run_lm_eval` call; evaluate.eval_resources decides which, with how many GPUs.
Light at import: lm_eval is imported inside the functions that run it.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hpc_grpo.common.loading import load_object
from hpc_grpo.config import eval_tasks
from hpc_grpo.evaluation.evaluate import GSM8K_RAW_HINT, Placement
from hpc_grpo.rewards.gsm8k import gsm8k_reward
from hpc_grpo.rewards.math_boxed import last_boxed, math_reward

LOCAL_PREFIX = "hpc_grpo_"  # our task's name in lm-eval (results are reported under our name)


def lm_eval_tasks_dir() -> Path:
    """The installed lm_eval/tasks folder (found without importing lm_eval, which costs ~0.8 s)."""
    import importlib.util

    spec = importlib.util.find_spec("lm_eval")
    if spec is None or spec.origin is None:
        raise RuntimeError("lm-eval is not installed: pip install 'hpc-grpo[eval]' (lm-eval>=0.4.8)")
    return Path(spec.origin).parent / "tasks"


def task_yaml(task: str, train_file: Path, test_file: Path, tasks_dir: Path | None = None) -> str:
    """The local task definition: lm-eval's YAML by `include:`, with the dataset pointed at local files."""
    known = eval_tasks.lm_eval_tasks(eval_tasks.names())
    if task not in known:
        raise ValueError(f"unknown lm-eval task {task!r}: use one of {', '.join(known)}")
    base = (tasks_dir or lm_eval_tasks_dir()) / str(eval_tasks.get(task).lm_eval_yaml)
    if not base.is_file():
        raise RuntimeError(f"lm-eval has no {base}: this lm-eval version lacks the {task} task")
    doc: dict[str, Any] = {
        "include": str(base),
        "task": LOCAL_PREFIX + task,
        "tag": [],
        "dataset_path": "json",
        "dataset_name": None,
        "dataset_kwargs": {"data_files": {"train": str(train_file), "test": str(test_file)}},
    }
    return json.dumps(doc, indent=2) + "\n"  # JSON is YAML; no second YAML writer needed


def write_task_dir(folder: Path, tasks: list[str], train_file: Path, test_file: Path) -> Path:
    """RUN/eval/tasks/<task>.yaml for each task: pass it as lm_eval's --include_path (also by hand)."""
    for path, what in ((train_file, "train"), (test_file, "test")):
        if not Path(path).is_file():
            entry = eval_tasks.get(tasks[0])
            hint = (GSM8K_RAW_HINT.format(split=what) if entry.data_command == "gsm8k"
                    else f"`hpc-grpo data {entry.data_command}` writes them")
            raise FileNotFoundError(f"{entry.name} {what} file {path} does not exist: set eval.{what}_file to a jsonl "
                                    f"with {entry.row_fields} rows ({hint})")
    folder.mkdir(parents=True, exist_ok=True)
    for task in tasks:
        (folder / f"{task}.yaml").write_text(task_yaml(task, Path(train_file), Path(test_file)))
    return folder


@dataclass(frozen=True, slots=True)
class LmEvalArgs:
    """Everything simple_evaluate gets, built without lm_eval (so a unit test can check the vLLM arguments)."""

    model: str  # "hf" | "vllm"
    model_args: dict[str, Any]
    tasks: list[str]
    num_fewshot: int | None
    limit: int | None
    batch_size: int | str
    device: str | None
    gen_kwargs: dict[str, Any] = field(default_factory=dict)

    def cli(self, include_path: Path) -> list[str]:
        """The same run as an `lm_eval` command line (printed for people; used by the test by hand)."""
        argv = ["lm_eval", "--model", self.model,
                "--model_args", ",".join(f"{k}={v}" for k, v in self.model_args.items()),
                "--include_path", str(include_path), "--tasks", ",".join(self.tasks),
                "--batch_size", str(self.batch_size), "--log_samples"]
        if self.device:
            argv += ["--device", self.device]
        if self.limit is not None:
            argv += ["--limit", str(self.limit)]
        if self.num_fewshot is not None:
            argv += ["--num_fewshot", str(self.num_fewshot)]
        if self.gen_kwargs:
            argv += ["--gen_kwargs", ",".join(f"{k}={v}" for k, v in self.gen_kwargs.items())]
        return argv


def build_args(model_dir: str | Path, tasks: list[str], placement: Placement, *, limit: int | None,
               num_fewshot: int | None, batch_size: int, max_gen_toks: int | None,
               gpu_memory_utilization: float = 0.85, dtype: str = "auto") -> LmEvalArgs:
    """lm-eval's model and run arguments for a placement (evaluate.eval_resources decided and checked it).

    hf: `pretrained=DIR` on the placement's device. vllm: tensor_parallel_size x data_parallel_size = the eval
    node's GPUs (vLLM's TP does not cross nodes here); lm-eval's vllm backend ignores `device`, so none is passed.
    """
    names = [LOCAL_PREFIX + t for t in tasks]
    gen = {"max_gen_toks": max_gen_toks} if max_gen_toks else {}
    if placement.backend == "hf":
        margs: dict[str, Any] = {"pretrained": str(model_dir), "dtype": dtype if placement.gpus else "float32"}
        return LmEvalArgs("hf", margs, names, num_fewshot, limit, batch_size, placement.device, gen)
    if placement.backend == "vllm":
        margs = {"pretrained": str(model_dir), "tensor_parallel_size": placement.tp, "dtype": dtype,
                 "gpu_memory_utilization": gpu_memory_utilization, "data_parallel_size": placement.dp}
        return LmEvalArgs("vllm", margs, names, num_fewshot, limit, "auto", None, gen)
    raise ValueError(f"unknown eval.backend {placement.backend!r}: use hf or vllm")


def offline_env() -> dict[str, str]:
    """No Hub: lm-eval and datasets read only local files."""
    return {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
            "TOKENIZERS_PARALLELISM": "false"}


def run_lm_eval(args: LmEvalArgs, include_path: Path) -> dict[str, Any]:
    """Run lm-eval in this process; returns {task: TaskScore-as-dict} plus wall time."""
    os.environ.update(offline_env())
    import lm_eval
    from lm_eval.tasks import TaskManager

    t0 = time.time()
    results = lm_eval.simple_evaluate(
        model=args.model, model_args=args.model_args, tasks=args.tasks, num_fewshot=args.num_fewshot,
        limit=args.limit, batch_size=args.batch_size, device=args.device, log_samples=True,
        task_manager=TaskManager(include_path=str(include_path)), gen_kwargs=args.gen_kwargs or None,
        bootstrap_iters=0,
    )
    wall = time.time() - t0
    out: dict[str, Any] = {}
    for name in args.tasks:
        task = name.removeprefix(LOCAL_PREFIX)
        scores = load_object(eval_tasks.get(task).scorer)
        out[task] = scores(results["results"][name], results["samples"][name])
    return {"tasks": out, "wall_time_s": round(wall, 3), "lm_eval_version": getattr(lm_eval, "__version__", "?"),
            "n_shot": results.get("n-shot", {})}


def gsm8k_scores(result: dict[str, Any], samples: list[dict[str, Any]]) -> dict[str, Any]:
    """lm-eval's two numbers, verl's strict reward on the same generations, and one row per problem.

    lm-eval logs one sample per (problem, filter) with the same generation: they are folded into one row
    holding both filters' answers and verdicts.
    """
    by_doc: dict[int, dict[str, Any]] = {}
    for s in samples:
        row = by_doc.get(s["doc_id"])
        if row is None:
            text = s["resps"][0][0] if s.get("resps") else ""
            truth = gsm8k_truth(s.get("target", ""), s["doc"])
            row = by_doc[s["doc_id"]] = {"doc_id": s["doc_id"], "question": s["doc"].get("question", ""),
                                         "target": truth, "completion": text,
                                         "verl_strict": gsm8k_reward(text, truth)}
        key = {"strict-match": "strict", "flexible-extract": "flexible"}.get(s.get("filter", ""))
        if key is not None:
            resp = s.get("filtered_resps")
            row[f"{key}_answer"] = str(resp[0]) if isinstance(resp, list) and resp else resp
            row[f"{key}_correct"] = float(s.get("exact_match", 0.0))
    rows = [by_doc[k] for k in sorted(by_doc)]
    n = len(rows)
    return {
        "strict_match": float(result["exact_match,strict-match"]),
        "flexible_extract": float(result["exact_match,flexible-extract"]),
        "verl_strict_reward": sum(r["verl_strict"] for r in rows) / n if n else 0.0,
        "n": n,
        "samples": rows,
    }


def gsm8k_truth(target: str, doc: dict[str, Any]) -> str:
    """The reference number, as verl's data preparation writes it (after the last '#### ', no commas)."""
    text = str(doc.get("answer") or target)
    return text.rsplit("#### ", 1)[-1].replace(",", "").strip()


def math_scores(result: dict[str, Any], samples: list[dict[str, Any]]) -> dict[str, Any]:
    """lm-eval's exact match (hendrycks_math: the answer between the first and last `$`), the training reward
    (math_boxed: the last `\\boxed{}`) on the same generations, and one row per problem."""
    rows = []
    for s in sorted(samples, key=lambda s: s["doc_id"]):
        text = s["resps"][0][0] if s.get("resps") else ""
        truth = last_boxed(str(s["doc"].get("solution", ""))) or str(s["doc"].get("answer", ""))
        rows.append({"doc_id": s["doc_id"], "problem": s["doc"].get("problem", ""), "target": truth,
                     "completion": text, "correct": float(s.get("exact_match", 0.0)),
                     "boxed_reward": math_reward(text, truth)})
    n = len(rows)
    return {"exact_match": float(result["exact_match,none"]),
            "boxed_reward": sum(r["boxed_reward"] for r in rows) / n if n else 0.0, "n": n, "samples": rows}
