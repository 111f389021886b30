"""The hpc-grpo command line: the Typer app, its commands, and the console entry point.

Each command parses its options, calls one function of hpc_grpo.commands (or the library) and prints; the
commands live in small modules by theme (catalog_cmds, run_cmds, watch_cmds, ckpt_cmds, eval_cmds, data_cmds, import_cmds)
and are all registered here, in the order `--help` lists them. Heavy modules (torch, trl, lm_eval, submitit's
executors) are imported only inside the commands that need them: plan/render/status must answer instantly on a
login node. Exit codes: 0 ok, 1 an error finding or a failed job, 2 invalid input.
"""

from __future__ import annotations

import os
import sys

# hpc-grpo uses no pydantic plugin; without this, pydantic scans every installed distribution's entry points for
# one, which costs ~60 ms of every command in a venv with a training stack. An explicit user setting wins.
os.environ.setdefault("PYDANTIC_DISABLE_PLUGINS", "__all__")

import typer  # noqa: E402

from hpc_grpo.cli import catalog_cmds, ckpt_cmds, data_cmds, eval_cmds, import_cmds, run_cmds, watch_cmds  # noqa: E402
from hpc_grpo.cli.console import err, print_error  # noqa: E402
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
app.add_typer(model_app, name="model")

app.command()(catalog_cmds.recipes)
app.command()(catalog_cmds.clusters)
app.command()(run_cmds.plan)
app.command()(run_cmds.render)
app.command()(run_cmds.submit)
app.command()(watch_cmds.status)
app.command()(watch_cmds.logs)
app.command()(ckpt_cmds.resume)
app.command("runs")(catalog_cmds.list_runs)
app.command("eval")(eval_cmds.eval_cmd)
app.command()(run_cmds.rehearse)
app.command("export")(ckpt_cmds.export_cmd)
app.command()(eval_cmds.report)
app.command("prune-ckpts")(ckpt_cmds.prune_ckpts)
app.command("eval-code")(eval_cmds.eval_code)
app.command("import")(import_cmds.import_cmd)
data_cmds.add_data_commands(data_app)  # one per data set of the reward and eval-task registries
model_app.command("tiny")(data_cmds.model_tiny)


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
