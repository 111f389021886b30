"""`hpc-grpo data NAME` and `model tiny`: data sets and a local model, written and listed.

The data commands are not written here one by one: each distinct DataSet that an entry of the reward registry or
the eval-task registry carries (hpc_grpo/config/data_sets.py) becomes one command, its options and help from the
entry, its preparer loaded only when it runs. Output goes to --out, else config.registry.data_root()/NAME.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Annotated, Any

import typer

from hpc_grpo.cli.console import out, short_help
from hpc_grpo.common.loading import load_object
from hpc_grpo.config import eval_tasks, reward_registry
from hpc_grpo.config.data_sets import DataSet
from hpc_grpo.config.registry import DATA_ENV, DEFAULT_DATA_ROOT, TINY_MODEL_DIR, data_root


def data_sets() -> Iterator[DataSet]:
    """Every data set the registries name, once each, rewards first (in registry order). ValueError when two
    entries give one command name different definitions: `hpc-grpo data NAME` must mean one thing."""
    seen: dict[str, DataSet] = {}
    named = [r.data for r in reward_registry.all_rewards()] + [t.data for t in eval_tasks.all_tasks() if t.data]
    for ds in named:
        if ds.name in seen:
            if seen[ds.name] != ds:
                raise ValueError(f"two registry entries define `hpc-grpo data {ds.name}` differently; give one of "
                                 "them the other's DataSet (hpc_grpo/config/data_sets.py)")
            continue
        seen[ds.name] = ds
        yield ds


def run_data_set(ds: DataSet, out_dir: Path | None, **options: Any) -> None:
    """Run the preparer into out_dir (default: the data root's folder for it) and print what it wrote."""
    target = (out_dir or data_root() / ds.name).expanduser()
    result = load_object(ds.preparer)(out_dir=target, **options)
    out.print(f"{ds.label} from {result.source}: {result.n_train} train, {result.n_test} test rows{result.note}")
    for p in (result.verl_train, result.verl_test, result.trl_train, result.trl_test):
        out.print(f"  {p}")


def data_command(ds: DataSet) -> Callable[..., None]:
    """The Typer command for one data set: a function whose signature Typer reads (the entry's options, then
    --out), calling run_data_set."""
    params = [
        inspect.Parameter(o.name, inspect.Parameter.KEYWORD_ONLY, default=o.default,
                          annotation=Annotated[o.kind if o.default is not None else o.kind | None,
                                               typer.Option(o.cli_flag, help=o.help)])
        for o in ds.options
    ]
    out_help = f"output folder (default: ${DATA_ENV}/{ds.name}, else {DEFAULT_DATA_ROOT}/{ds.name})"
    params.append(inspect.Parameter("out_dir", inspect.Parameter.KEYWORD_ONLY, default=None,
                                    annotation=Annotated[Path | None, typer.Option("--out", help=out_help)]))

    def command(**kwargs: Any) -> None:
        run_data_set(ds, kwargs.pop("out_dir"), **kwargs)

    command.__name__ = f"data_{ds.name}"
    command.__doc__ = ds.help
    command.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    command.__annotations__ = {p.name: p.annotation for p in params}
    return command


def add_data_commands(app: typer.Typer) -> None:
    """One `data NAME` command per data set the registries name."""
    for ds in data_sets():
        app.command(ds.name, short_help=short_help(ds.help))(data_command(ds))


def model_tiny(
    out_dir: Annotated[Path, typer.Option("--out", help="output folder")] = Path(TINY_MODEL_DIR),
    seed: Annotated[int, typer.Option(help="random seed")] = 0,
) -> None:
    """Build a tiny random Qwen2-architecture model with a locally trained tokenizer (no Hub needed)."""
    from hpc_grpo.data.tiny_model import ensure_tiny_model

    path = ensure_tiny_model(out_dir.expanduser(), seed=seed)
    out.print(f"Tiny model at {path}")
