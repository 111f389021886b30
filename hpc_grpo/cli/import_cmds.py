"""`hpc-grpo import SCRIPT.sh`: a verl launch script becomes a recipe (hpc_grpo.engines.verl_import); this module
reads the file, prints where each override went, and writes the recipe."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from hpc_grpo.cli.console import Table, err, out
from hpc_grpo.common.yamlio import SpecError


def import_cmd(
    script: Annotated[Path, typer.Argument(help="a verl launch script (bash, `python3 -m verl.trainer.main_ppo ...`)")],
    recipe: Annotated[str | None, typer.Option("--recipe", help="the recipe to base it on (default: "
                                                  "qwen2.5-3b-gsm8k-lora for FSDP, qwen2.5-72b-megatron for Megatron)")] = None,
    output: Annotated[Path | None, typer.Option("-o", "--output", help="write the recipe here (default: print "
                                                   "it)")] = None,
    cluster: Annotated[str, typer.Option("--cluster", help="the cluster profile the comparison resolves on")] = "local",
) -> None:
    """Turn a verl launch script into a recipe that records only what differs from its base recipe."""
    from rich.markup import escape

    from hpc_grpo.common.atomic import write_text_atomic
    from hpc_grpo.config.fields import check_name
    from hpc_grpo.engines.verl_import import import_script

    try:
        text = script.read_text()
    except OSError as exc:
        raise SpecError(f"cannot read {script}: {exc.strerror}", key="SCRIPT") from None
    if output is not None and output.exists():
        raise SpecError(f"{output} exists: choose another -o (import never overwrites a recipe)", key="-o")
    name = check_name((output or script).stem, "recipe")
    imported = import_script(text, name, base=recipe, cluster=cluster, source=script)
    t = Table(title=f"{script.name} -> recipe {name} (extends {imported.base}, {imported.backend})")
    for col in ("the script's", "went to", "why"):
        t.add_column(col, overflow="fold")
    for row in imported.rows:
        t.add_row(escape(row.item), escape(row.went), escape(row.why))
    err.print(t)
    if imported.changed:
        t = Table(title="Runs differently from the script: hpc-grpo decides these")
        for col in ("verl key", "script -> recipe", "why"):
            t.add_column(col, overflow="fold")
        for row in imported.changed:
            t.add_row(escape(row.item), escape(row.went), escape(row.why))
        err.print(t)
    err.print(f"Compared with verl's config: {imported.compared}", markup=False, highlight=False)
    for note in imported.script.notes:
        err.print(f"note: {note}", markup=False, highlight=False)
    if imported.script.unresolved:
        err.print(f"not resolved in the script (left as written): {', '.join(imported.script.unresolved)}",
                  markup=False, highlight=False)
    for key, value in imported.script.placeholders:
        err.print(f"to fill: {key}={value} (the script leaves it to its user)", markup=False, highlight=False)
    for line in imported.script.ignored:
        err.print(f"ignored (sets nothing the trainer reads): {line}", markup=False, highlight=False)
    text_out = imported.yaml_text(str(script))
    if output is None:
        out.print(text_out, markup=False, highlight=False, end="")
        return
    output.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(output, text_out)
    err.print(f"wrote {output}: check it with `{plan_command(output)}`", markup=False, highlight=False)


def plan_command(output: Path) -> str:
    """The plan command for the recipe file import wrote, as the user can paste it from where they are."""
    import shlex

    typed = str(output)
    if "/" not in typed:
        typed = f"./{typed}"
    return f"hpc-grpo plan recipe={shlex.quote(typed)}"
