"""`hpc-grpo recipes`, `clusters` and `runs`: one row per thing hpc-grpo can find, as the CLI prints it (and
`--json` emits it). Profiles are read raw: a listing must not fail on one profile that no longer validates."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hpc_grpo.config import registry
from hpc_grpo.config.engine_traits import traits_of


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


def _cell(text: Any) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def recipes_markdown() -> str:
    """The README's recipe table, from the recipe files (`hpc-grpo recipes --markdown`; a test compares)."""
    from hpc_grpo.config.resolve import load_raw
    from hpc_grpo.config.spec import Recipe

    lines = ["| recipe | engine / backend | nodes x GPUs | reward | what |", "|---|---|---|---|---|"]
    for name in registry.list_names("recipes"):
        r = Recipe.model_validate(load_raw("recipes", name)[0])
        # a backend is a config of the engine's Hydra tree (verl: ppo_trainer or ppo_megatron_trainer); trl has none
        engine = f"{r.engine} / {r.backend}" if traits_of(r.engine).hydra_config else r.engine
        gpus = f"{r.resources.nodes} x {r.resources.gpus_per_node}" if r.resources.gpus_per_node else \
            f"{r.resources.nodes} x CPU"
        reward = "- (own driver)" if r.launch.driver else r.grpo.reward
        lines.append(f"| `{name}` | {engine} | {gpus} | {reward} | {_cell(r.description)} |")
    return "\n".join(lines) + "\n"


def clusters_markdown() -> str:
    """The README's cluster-profile table, from the profile files (`hpc-grpo clusters --markdown`; a test compares)."""
    lines = ["| profile | scheduler | nodes (most) x GPUs | what |", "|---|---|---|---|"]
    for r in cluster_rows():
        gpus = (f"{r['nodes_max']} x {r['gpus_per_node']}" + (f" {r['gpu']}" if r["gpu"] else "")
                if r["gpus_per_node"] else f"{r['nodes_max']} x CPU")
        lines.append(f"| `{r['name']}` | {r['scheduler']} | {_cell(gpus)} | {_cell(r['description'])} |")
    return "\n".join(lines) + "\n"


def run_rows() -> list[dict[str, Any]]:
    """Every run of this user under every cluster's runs root, newest first."""
    return run_listing()[0]


def run_listing() -> tuple[list[dict[str, Any]], list[Path], int]:
    """(this user's runs under every cluster's runs root, newest first; the roots looked in; how many other users'
    runs there were passed over)."""
    from hpc_grpo.commands.status import runs_roots
    from hpc_grpo.runstate.runs import run_summary, scan_runs

    roots = runs_roots()
    found, others = scan_runs(roots)
    return [run_summary(p) for p in found], roots, others
