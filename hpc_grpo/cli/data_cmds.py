"""`hpc-grpo data gsm8k`, `data codegen`, `data math` and `model tiny`: data sets and a local model, written and listed."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from hpc_grpo.cli.console import out
from hpc_grpo.config.registry import DATA_ENV, DEFAULT_DATA_ROOT, TINY_MODEL_DIR, data_root

_OUT_HELP = f"output folder (default: ${DATA_ENV}/{{name}}, else {DEFAULT_DATA_ROOT}/{{name}})"


def data_gsm8k(
    source: Annotated[str, typer.Option(help="'hf' (openai/gsm8k from the Hub) or a folder with train.jsonl and test.jsonl")] = "hf",
    out_dir: Annotated[Path | None, typer.Option("--out", help=_OUT_HELP.format(name="gsm8k"))] = None,
) -> None:
    """Write GSM8K in verl's parquet format and the trl engine's jsonl format."""
    from hpc_grpo.data.gsm8k import prepare_gsm8k

    result = prepare_gsm8k(source, (out_dir or data_root() / "gsm8k").expanduser())
    out.print(f"GSM8K from {result.source}: {result.n_train} train, {result.n_test} test rows")
    for p in (result.verl_train, result.verl_test, result.trl_train, result.trl_test):
        out.print(f"  {p}")


def data_codegen(
    source: Annotated[str, typer.Option(help="problems file (JSON/JSONL: ours, MBPP, APPS/TACO, HumanEval layout), "
                                             "'tiny' (the 16 shipped problems) or hf:NAME[:CONFIG] when online")] = "tiny",
    out_dir: Annotated[Path | None, typer.Option("--out", help=_OUT_HELP.format(name="codegen"))] = None,
    test_every: Annotated[int, typer.Option(help="every N-th problem goes to the test split (0: test = train)")] = 4,
    max_prompt_tokens: Annotated[int | None, typer.Option(help="drop longer prompts (needs --tokenizer)")] = None,
    tokenizer: Annotated[str | None, typer.Option(help="model folder whose tokenizer counts prompt tokens")] = None,
) -> None:
    """Write code problems with their tests in verl's parquet format and the trl engine's jsonl format."""
    from hpc_grpo.data.codegen import SHIPPED_PROBLEMS, prepare_codegen

    src = str(SHIPPED_PROBLEMS) if source == "tiny" else source  # the option's name for the shipped file
    result = prepare_codegen(src, (out_dir or data_root() / "codegen").expanduser(), test_every, max_prompt_tokens, tokenizer)
    out.print(f"code problems from {result.source}: {result.n_train} train, {result.n_test} test rows"
              + (f", {result.dropped_overlong} overlong prompts dropped" if result.dropped_overlong else ""))
    for p in (result.verl_train, result.verl_test, result.trl_train, result.trl_test):
        out.print(f"  {p}")


def data_math(
    source: Annotated[str, typer.Option("--from", help="MATH-style jsonl or parquet (problem + solution or answer), "
                                                         "or 'tiny' (the 30 shipped problems)")] = "tiny",
    out_dir: Annotated[Path, typer.Option("--out", help="output folder")] = Path("~/hpc-grpo-data/math"),
    test: Annotated[str | None, typer.Option("--test", help="a separate test file (default: split --from)")] = None,
    test_every: Annotated[int, typer.Option(help="without --test: every N-th row goes to the test split "
                                                 "(0: test = train)")] = 4,
) -> None:
    """Write MATH problems in verl's parquet format, the trl engine's jsonl format, and lm-eval's rows."""
    from hpc_grpo.data.math import SHIPPED_PROBLEMS, prepare_math

    src = str(SHIPPED_PROBLEMS) if source == "tiny" else source
    result = prepare_math(src, out_dir.expanduser(), test, test_every)
    out.print(f"MATH problems from {result.source}: {result.n_train} train, {result.n_test} test rows")
    for p in (result.verl_train, result.verl_test, result.trl_train, result.trl_test):
        out.print(f"  {p}")


def model_tiny(
    out_dir: Annotated[Path, typer.Option("--out", help="output folder")] = Path(TINY_MODEL_DIR),
    seed: Annotated[int, typer.Option(help="random seed")] = 0,
) -> None:
    """Build a tiny random Qwen2-architecture model with a locally trained tokenizer (no Hub needed)."""
    from hpc_grpo.data.tiny_model import ensure_tiny_model

    path = ensure_tiny_model(out_dir.expanduser(), seed=seed)
    out.print(f"Tiny model at {path}")
