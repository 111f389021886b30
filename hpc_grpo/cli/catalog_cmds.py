"""`hpc-grpo recipes`, `clusters`, `runs`: what hpc-grpo can find, as a table or --json."""

from __future__ import annotations

from typing import Annotated

import typer

from hpc_grpo.cli.console import print_json, print_table
from hpc_grpo.cli.options import JsonT


MarkdownT = Annotated[bool, typer.Option("--markdown", help="print the markdown table the README holds (a test "
                                         "compares the two)")]


def recipes(
    as_json: JsonT = False,
    matrix: Annotated[bool, typer.Option("--matrix", help="plan every recipe on every cluster profile and print the "
                                         "markdown table docs/recipe-matrix.md holds (ok, or refused and why)")] = False,
    reference: Annotated[bool, typer.Option("--reference", help="print the field reference docs/reference.md holds: "
                                            "every recipe and cluster-profile key with its type, default, rule and "
                                            "description")] = False,
    markdown: MarkdownT = False,
) -> None:
    """List the recipes hpc-grpo can find."""
    from hpc_grpo.commands.catalog import recipe_rows, recipes_markdown

    if markdown:
        print(recipes_markdown(), end="")  # plain stdout: the README's table is this text
        return
    if reference:
        from hpc_grpo.commands.reference import to_markdown as reference_page

        print(reference_page(), end="")  # plain stdout: the file is this text, byte for byte
        return
    if matrix:
        from hpc_grpo.commands.matrix import matrix as plan_matrix, to_markdown

        cells = plan_matrix()
        if as_json:
            print_json([{"recipe": c.recipe, "cluster": c.cluster, "ok": c.ok, "reasons": list(c.reasons)}
                        for c in cells])
        else:
            print(to_markdown(cells), end="")  # plain stdout: the file is this text, byte for byte
        return
    rows = recipe_rows()
    if as_json:
        print_json(rows)
        return
    print_table("Recipes", ("name", "engine", "backend", "model", "description"),
                [(r["name"], r["engine"], r["backend"], r["model"], r["description"]) for r in rows], overflow="fold")


def clusters(as_json: JsonT = False, markdown: MarkdownT = False) -> None:
    """List the cluster profiles hpc-grpo can find."""
    from hpc_grpo.commands.catalog import cluster_rows, clusters_markdown

    if markdown:
        print(clusters_markdown(), end="")  # plain stdout: the README's table is this text
        return
    rows = cluster_rows()
    if as_json:
        print_json(rows)
        return
    print_table("Clusters", ("name", "scheduler", "partition", "nodes", "GPUs/node", "description"),
                [(r["name"], r["scheduler"], str(r["partition"] or "-"), str(r["nodes_max"]), str(r["gpus_per_node"]),
                  r["description"]) for r in rows], overflow="fold")


def list_runs(as_json: JsonT = False) -> None:
    """List your runs under every cluster's runs root, newest first."""
    from hpc_grpo.cli.console import out
    from hpc_grpo.commands.catalog import run_listing

    rows, roots, others = run_listing()
    if as_json:
        print_json(rows)
        return
    if rows:
        print_table("Runs", ("name", "jobs", "path"), [(r["name"], " ".join(r["jobs"]) or "-", r["path"])
                                                       for r in rows], overflow="fold")
    else:
        out.print("No run of yours found.")
    seen = [str(r) for r in roots if r.is_dir()]
    missing = [str(r) for r in roots if not r.is_dir()]
    out.print(f"Looked in: {', '.join(seen) or 'none'}" + (f" (not on this machine: {', '.join(missing)})"
                                                            if missing else ""))
    if others:
        out.print(f"{others} run(s) of other users there not listed")
