"""The arguments and options several commands share, and the `recipe=NAME cluster=NAME key=value ...` parser.

A command line reads like the recipe it changes: `recipe=` and `cluster=` pick the files, every other
`key=value` overrides one key of them.
"""

from __future__ import annotations

from typing import Annotated, Any

import typer

from hpc_grpo.cli.console import err
from hpc_grpo.common.yamlio import SpecError
from hpc_grpo.config import registry

ArgsT = Annotated[list[str] | None, typer.Argument(help="recipe=NAME [cluster=NAME] [key=value ...]", show_default=False)]
JsonT = Annotated[bool, typer.Option("--json", help="machine-readable output")]
NameT = Annotated[str | None, typer.Option("--name", help="run name (default: recipe name + timestamp)")]
SchemaT = Annotated[bool, typer.Option("--schema/--no-schema", help="compose against verl's real config if installed")]
AcceptT = Annotated[list[str] | None, typer.Option("--accept", help="accept an estimate's error, recorded in the run's frozen spec "
                                             "(repeatable; acceptable: memory). A rule's error cannot be accepted")]
RunT = Annotated[str | None, typer.Argument(help="run name or folder (default: the newest run)")]
WaitT = Annotated[bool | None, typer.Option("--wait/--no-wait", help="follow the job to its end "
                                               "(default: on for cluster=local)")]
VerboseT = Annotated[bool, typer.Option("--verbose", "-v", help="with --wait: print the job's whole log (the "
                                        "engine's config dump, vLLM's and Ray's warnings), not only hpc-grpo's "
                                        "lines, the steps and errors")]


def parse_args(args: list[str] | None) -> tuple[str, str | None, list[str]]:
    """(recipe, cluster or None, the other key=value items); SpecError naming the known recipes without one."""
    recipe: str | None = None
    cluster: str | None = None
    rest: list[str] = []
    for item in args or []:
        if item.startswith("recipe="):
            recipe = item.split("=", 1)[1]
        elif item.startswith("cluster="):
            cluster = item.split("=", 1)[1]
        else:
            rest.append(item)
    if not recipe:
        raise SpecError(f"no recipe given: add recipe=NAME (known: {', '.join(registry.list_names('recipes'))})", key="recipe")
    return recipe, cluster, rest


def pick_cluster(cluster: str | None) -> str:
    """The cluster profile to use (given, or chosen from where this runs), said on stderr with the reason."""
    from hpc_grpo.cluster.clusterpick import choose_cluster

    choice = choose_cluster(cluster)
    err.print(f"cluster: {choice.name} ({choice.why})")
    return choice.name


def resolve(args: list[str] | None, name: str | None) -> Any:
    """The RunSpec the command line describes: recipe + cluster profile + overrides, and on local and slurm-dev
    the checkout's venv for the engine where the submitting interpreter cannot run its job."""
    from hpc_grpo.engines.verl_keymap import resolve_with_verl_keys
    from hpc_grpo.planning.interpreter import choose_interpreter

    recipe, cluster, overrides = parse_args(args)
    resolved, notes = resolve_with_verl_keys(recipe, pick_cluster(cluster), overrides, run_name=name)
    for note in notes:
        err.print(f"verl key: {note}", markup=False, highlight=False)
    spec, why = choose_interpreter(resolved)
    if why:
        err.print(f"python: {spec.python} ({why})", markup=False, highlight=False)
    return spec
