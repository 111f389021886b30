"""The hpc-grpo command line: the Typer app, its commands, and the console entry point.

Each command parses its options, calls one function of hpc_grpo.commands (or the library) and prints; the
commands live in small modules by theme (catalog_cmds, run_cmds, sweep_cmds, watch_cmds, ckpt_cmds, eval_cmds, data_cmds, import_cmds)
and are all registered here, in the order `--help` lists them. Heavy modules (torch, trl, lm_eval, submitit's
executors) are imported only inside the commands that need them: plan/render/status must answer instantly on a
login node. Exit codes: 0 ok, 1 an error finding or a failed job, 2 invalid input.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

# hpc-grpo uses no pydantic plugin; without this, pydantic scans every installed distribution's entry points for
# one, which costs ~60 ms of every command in a venv with a training stack. An explicit user setting wins.
os.environ.setdefault("PYDANTIC_DISABLE_PLUGINS", "__all__")

import typer  # noqa: E402

from hpc_grpo import __version__  # noqa: E402
from hpc_grpo.cli import (catalog_cmds, ckpt_cmds, data_cmds, eval_cmds, import_cmds, run_cmds, sweep_cmds,  # noqa: E402
                          watch_cmds)
from hpc_grpo.cli.console import err, print_error, short_help  # noqa: E402
from hpc_grpo.common.yamlio import SpecError  # noqa: E402

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="Validated, rendered and resumable GRPO post-training jobs (verl, trl) on Slurm clusters.",
    rich_markup_mode=None,
)
data_app = typer.Typer(help="Prepare training and evaluation data.", no_args_is_help=True)
model_app = typer.Typer(help="Build local models for machines without the Hugging Face Hub.", no_args_is_help=True)
app.add_typer(data_app, name="data")


def _command(fn: Callable[..., object], name: str | None = None) -> None:
    """Register a command with its whole first sentence as the line `--help` lists."""
    app.command(name, short_help=short_help(fn.__doc__))(fn)


def _print_version(value: bool) -> None:
    """`--version`: the installed package's version, so a bug report can name it."""
    if value:
        print(f"hpc-grpo {__version__}")
        raise typer.Exit(0)


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", help="Print the version and exit.", is_eager=True,
                                 callback=_print_version),
) -> None:
    """Validated, rendered and resumable GRPO post-training jobs (verl, trl) on Slurm clusters."""

app.add_typer(model_app, name="model")

_command(catalog_cmds.recipes)
_command(catalog_cmds.clusters)
_command(run_cmds.plan)
_command(run_cmds.render)
_command(run_cmds.submit)
_command(sweep_cmds.sweep)
_command(watch_cmds.status)
_command(watch_cmds.logs)
_command(ckpt_cmds.resume)
_command(catalog_cmds.list_runs, "runs")
_command(eval_cmds.eval_cmd, "eval")
_command(run_cmds.rehearse)
_command(ckpt_cmds.export_cmd, "export")
_command(eval_cmds.report)
_command(ckpt_cmds.prune_ckpts, "prune-ckpts")
_command(eval_cmds.eval_code, "eval-code")
_command(import_cmds.import_cmd, "import")
data_cmds.add_data_commands(data_app)  # one per data set of the reward and eval-task registries
model_app.command("tiny", short_help=short_help(data_cmds.model_tiny.__doc__))(data_cmds.model_tiny)


def main() -> None:
    """Console entry point: input errors exit 2 with a message that names the key and the fix."""
    try:
        rc = app(standalone_mode=False)
        sys.exit(rc if isinstance(rc, int) else 0)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except SpecError as exc:
        print_error(exc)
        sys.exit(2)
    except typer.Abort:
        err.print("Aborted.")
        sys.exit(1)
    except Exception as exc:
        # Usage errors (unknown option, missing value) are click exceptions from typer's bundled click: they
        # print themselves and carry their exit code (2).
        show, code = getattr(exc, "show", None), getattr(exc, "exit_code", None)
        if callable(show) and isinstance(code, int):
            show()
            sys.exit(code)
        raise


if __name__ == "__main__":
    main()
