"""The data sets `hpc-grpo data NAME` writes, as plain data: the command's name, its preparer ("module:function",
loaded only when the command runs), its options and help text. A reward's registry entry (reward_registry) or an
eval task's (eval_tasks) carries the DataSet its rows come from; the CLI makes one `data` command per distinct
DataSet they name, so a new data set is written where its reward or task is, and nowhere else.

A preparer is called as preparer(out_dir=Path, **options) and returns hpc_grpo.data.gsm8k.PrepareResult (or a
subclass): the folders, row counts and source the command prints.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class DataOption:
    """One option of a data command: the preparer's keyword `name`, shown as `--name-with-dashes` (or `flag`)."""

    name: str
    kind: type  # str, int, float or bool; with default None the option may be left out
    default: object
    help: str
    flag: str | None = None

    @property
    def cli_flag(self) -> str:
        return self.flag or "--" + self.name.replace("_", "-")


@dataclass(frozen=True, slots=True)
class DataSet:
    """One `hpc-grpo data NAME` command; it writes into --out, else data_root()/NAME (config.registry)."""

    name: str
    preparer: str  # "module:function" (out_dir, **options) -> PrepareResult
    help: str  # the command's help: what it writes
    label: str  # how the printed summary names the rows ("GSM8K", "MATH problems")
    options: tuple[DataOption, ...] = ()


_TEST_EVERY = DataOption("test_every", int, 4, "every N-th row goes to the test split (0: test = train)")

GSM8K = DataSet(
    "gsm8k", "hpc_grpo.data.gsm8k:prepare_gsm8k", "Write GSM8K in verl's parquet format and the trl engine's jsonl "
    "format.", "GSM8K",
    (DataOption("source", str, "hf", "'hf' (openai/gsm8k from the Hub) or a folder with train.jsonl and test.jsonl"),))
CODEGEN = DataSet(
    "codegen", "hpc_grpo.data.codegen:prepare_codegen", "Write code problems with their tests in verl's parquet "
    "format and the trl engine's jsonl format.", "code problems",
    (DataOption("source", str, "tiny", "problems file (JSON/JSONL: ours, MBPP, APPS/TACO, HumanEval layout), 'tiny' "
                "(the 16 shipped problems) or hf:NAME[:CONFIG] when online"),
     _TEST_EVERY,
     DataOption("max_prompt_tokens", int, None, "drop longer prompts (needs --tokenizer)"),
     DataOption("tokenizer", str, None, "model folder whose tokenizer counts prompt tokens")))
MATH = DataSet(
    "math", "hpc_grpo.data.math:prepare_math", "Write MATH problems in verl's parquet format, the trl engine's jsonl "
    "format, and lm-eval's rows.", "MATH problems",
    (DataOption("source", str, "tiny", "MATH-style jsonl or parquet (problem + solution or answer), or 'tiny' (the 30 "
                "shipped problems)", flag="--from"),
     DataOption("test_source", str, None, "a separate test file (default: split --from)", flag="--test"),
     DataOption("test_every", int, 4, "without --test: every N-th row goes to the test split (0: test = train)")))
