"""`hpc-grpo recipes`, `clusters`, `runs`: what hpc-grpo can find, as a table or --json."""

from __future__ import annotations

from hpc_grpo.cli.console import print_json, print_table
from hpc_grpo.cli.options import JsonT


def recipes(as_json: JsonT = False) -> None:
    """List the recipes hpc-grpo can find."""
    from hpc_grpo.commands.catalog import recipe_rows

    rows = recipe_rows()
    if as_json:
        print_json(rows)
        return
    print_table("Recipes", ("name", "engine", "backend", "model", "description"),
                [(r["name"], r["engine"], r["backend"], r["model"], r["description"]) for r in rows], overflow="fold")


def clusters(as_json: JsonT = False) -> None:
    """List the cluster profiles hpc-grpo can find."""
    from hpc_grpo.commands.catalog import cluster_rows

    rows = cluster_rows()
    if as_json:
        print_json(rows)
        return
    print_table("Clusters", ("name", "scheduler", "partition", "nodes", "GPUs/node", "description"),
                [(r["name"], r["scheduler"], str(r["partition"] or "-"), str(r["nodes_max"]), str(r["gpus_per_node"]),
                  r["description"]) for r in rows], overflow="fold")


def list_runs(as_json: JsonT = False) -> None:
    """List runs under every cluster's runs root, newest first."""
    from hpc_grpo.commands.catalog import run_rows

    rows = run_rows()
    if as_json:
        print_json(rows)
        return
    print_table("Runs", ("name", "jobs", "path"), [(r["name"], " ".join(r["jobs"]) or "-", r["path"]) for r in rows],
                overflow="fold")
