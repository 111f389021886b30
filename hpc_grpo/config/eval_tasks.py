"""The evaluation tasks a recipe can name (eval.tasks), each in one entry: lm-eval's task or our own scorer, the
local files it reads and where they are found, and the metrics it reports with their table labels.

Plain data, importing nothing of ours: config.spec validates eval.tasks against it, plan and the eval job read it.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from hpc_grpo.config.data_sets import GSM8K, MATH, DataSet


@dataclass(frozen=True, slots=True)
class EvalTask:
    """One task. `lm_eval_yaml` (under lm_eval/tasks/) is included by a local task file that points it at local
    files; None means our own scorer (`scorer`, "module:function") runs it."""

    name: str
    lm_eval_yaml: str | None
    # lm-eval's tasks: "module:function(result, samples) -> scores" folding lm-eval's output into our scores;
    # our own tasks: the function that scores a model folder.
    scorer: str
    # The raw files it reads, found through the source.json that `hpc-grpo data <data.name>` writes beside the
    # prepared files (evaluate.data_files); () for a task that ships its problems (humaneval's wheel).
    files: tuple[str, ...]
    data: DataSet | None  # the data set whose command writes those files
    row_fields: str  # what each row of those files holds, for error messages
    metrics: tuple[tuple[str, str], ...]  # (key in the task's scores, its label in tables and reports)
    fewshot_note: str = ""

    @property
    def runs_lm_eval(self) -> bool:
        return self.lm_eval_yaml is not None

    @property
    def data_command(self) -> str | None:
        """The `hpc-grpo data` command writing the files it reads."""
        return self.data.name if self.data is not None else None


_TASKS: dict[str, EvalTask] = {}


def register(task: EvalTask) -> EvalTask:
    _TASKS[task.name] = task
    return task


def names() -> tuple[str, ...]:
    return tuple(_TASKS)


def all_tasks() -> Iterator[EvalTask]:
    return iter(tuple(_TASKS.values()))


def get(name: str) -> EvalTask:
    try:
        return _TASKS[name]
    except KeyError:
        raise KeyError(f"unknown eval task {name!r}: known tasks are {', '.join(_TASKS)}") from None


def lm_eval_tasks(tasks: Iterable[str]) -> list[str]:
    """The ones lm-eval runs (they read local files; the others have their own scorer)."""
    return [t for t in tasks if get(t).runs_lm_eval]


def needs_files(tasks: Iterable[str]) -> bool:
    return any(get(t).files for t in tasks)


def data_command(tasks: Iterable[str]) -> str | None:
    """The `hpc-grpo data` command whose files these tasks read; ValueError when two tasks read different data
    (one eval job reads one pair of files)."""
    commands = sorted({c for t in tasks if (c := get(t).data_command) is not None})
    if len(commands) > 1:
        raise ValueError(f"eval.tasks read different data sets ({' and '.join(commands)}); one evaluation reads one: "
                         "evaluate them in separate `hpc-grpo eval RUN --tasks ...` calls")
    return commands[0] if commands else None


_GSM8K_METRICS = (("strict_match", "strict"), ("flexible_extract", "flexible"), ("verl_strict_reward", "verl strict"))
_GSM8K_SCORES = "hpc_grpo.evaluation.scoring:gsm8k_scores"
register(EvalTask("gsm8k", "gsm8k/gsm8k.yaml", _GSM8K_SCORES, ("train.jsonl", "test.jsonl"), GSM8K, "question/answer",
                  _GSM8K_METRICS, fewshot_note="5-shot"))
register(EvalTask("gsm8k_cot", "gsm8k/gsm8k-cot.yaml", _GSM8K_SCORES, ("train.jsonl", "test.jsonl"), GSM8K, "question/answer",
                  _GSM8K_METRICS, fewshot_note="8-shot"))
register(EvalTask("humaneval", None, "hpc_grpo.evaluation.humaneval:task_scores", (), None, "",
                  (("pass@1", "pass@1"),)))
# lm-eval's hendrycks_math task (its answer between the first and last `$`, Hendrycks' normalisation) on the
# algebra YAML's prompt, with every local problem whatever its subject; minerva_math needs math_verify besides.
register(EvalTask("math", "hendrycks_math/hendrycks_math_algebra.yaml", "hpc_grpo.evaluation.scoring:math_scores",
                  ("train.jsonl", "test.jsonl"), MATH,
                  "problem/solution", (("exact_match", "exact"), ("boxed_reward", "boxed")), fewshot_note="0-shot"))
