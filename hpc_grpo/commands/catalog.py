"""`hpc-grpo recipes`, `clusters` and `runs`: one row per thing hpc-grpo can find, as the CLI prints it (and
`--json` emits it). Profiles are read raw: a listing must not fail on one profile that no longer validates."""

from __future__ import annotations

from typing import Any

from hpc_grpo.config import registry


def recipe_rows() -> list[dict[str, Any]]:
    """Every recipe on the search path: name, engine, backend, model, description and file."""
    from hpc_grpo.config.resolve import load_raw

    rows = []
    for name in registry.list_names("recipes"):
        data, _ = load_raw("recipes", name)
        rows.append({"name": name, "engine": data.get("engine", "verl"), "backend": data.get("backend", "fsdp"),
                     "model": (data.get("model") or {}).get("path", ""), "description": data.get("description", ""),
                     "path": str(registry.find("recipes", name))})
    return rows


def cluster_rows() -> list[dict[str, Any]]:
    """Every cluster profile on the search path: scheduler, partition, node and GPU counts, description, file."""
    from hpc_grpo.config.resolve import load_raw

    rows = []
    for name in registry.list_names("clusters"):
        data, _ = load_raw("clusters", name)
        rows.append({"name": name, "scheduler": data.get("scheduler", "slurm"), "partition": data.get("partition"),
                     "nodes_max": data.get("nodes_max"), "gpus_per_node": data.get("gpus_per_node"),
                     "gpu": data.get("gpu_type"), "description": data.get("description", ""),
                     "path": str(registry.find("clusters", name))})
    return rows


def run_rows() -> list[dict[str, Any]]:
    """Every run under every cluster's runs root, newest first."""
    from hpc_grpo.commands.status import runs_roots
    from hpc_grpo.runstate.runs import find_runs, run_summary

    return [run_summary(p) for p in find_runs(runs_roots())]
