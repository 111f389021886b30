"""Where a run differs from verl's own defaults, and why (`hpc-grpo plan --diff-defaults`).

A verl script leaves most keys at verl's defaults; a recipe sets many of them on purpose (val_before_train,
load_format, layered_summon, dynamic batch, offloads, recompute, filter_overlong_prompts...). This composes
verl's config twice with Hydra, as main_ppo would (no overrides, then the run's rendered overrides), compares
every leaf with interpolations resolved, and names for each difference what set it: a recipe key (from the recipe
file, the command line, or hpc-grpo's default for it), the cluster profile, a passthrough key, hpc-grpo's engine or
CPU-mode settings (each `Override` carries its source), or verl's own interpolation following another key.
Hydra is imported only when asked (it is not on the path of a plain `plan`).
"""

from __future__ import annotations

import warnings
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from hpc_grpo.config.spec import RunSpec
from hpc_grpo.engines.verl import CPU_SOURCES, VerlEngine, modelled_overrides
from hpc_grpo.config.verl_keys import bare_key

MISSING = "???"  # OmegaConf's mark for a value verl requires and does not default
ABSENT = "(not in verl's config)"  # a key the run adds with '+'


@dataclass(frozen=True, slots=True)
class Difference:
    """One verl key whose value in this run is not verl's default."""

    key: str
    default: Any  # verl's default, resolved where it is an interpolation; MISSING or ABSENT
    value: Any  # what this run's config holds, resolved
    why: str  # what set it: "recipe key grpo.kl_loss (recipe file)", "cluster profile", ...
    interpolation: str | None = None  # verl's raw default when it is a ${...} interpolation

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _compose(config_name: str, overrides: list[str], config_dir: Path) -> Any:
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with initialize_config_dir(config_dir=str(config_dir), version_base=None):
                return compose(config_name=config_name, overrides=overrides)
    finally:
        GlobalHydra.instance().clear()


def _leaves(node: Any, prefix: str = "") -> dict[str, Any]:
    """Dotted path -> value of every leaf (a list is one leaf: verl takes it whole)."""
    if isinstance(node, dict):
        out: dict[str, Any] = {}
        for k, v in node.items():
            out.update(_leaves(v, f"{prefix}.{k}" if prefix else str(k)))
        return out
    return {prefix: node}


def flat_config(cfg: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """(raw leaves, resolved leaves) of a composed config; a leaf that cannot resolve (it follows a key that is ???)
    keeps its raw ${...} text."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    raw = _leaves(OmegaConf.to_container(cfg, resolve=False))
    try:
        return raw, _leaves(OmegaConf.to_container(cfg, resolve=True, throw_on_missing=False))
    except OmegaConfBaseException:
        pass
    resolved: dict[str, Any] = {}
    for key, value in raw.items():
        try:
            got = OmegaConf.select(cfg, key, throw_on_missing=False)
            resolved[key] = OmegaConf.to_container(got, resolve=True) if OmegaConf.is_config(got) else got
        except OmegaConfBaseException:
            resolved[key] = value
    return raw, resolved


def _is_interpolation(value: Any) -> bool:
    return isinstance(value, str) and "${" in value


def _set_explicitly(spec: RunSpec, recipe_key: str) -> bool:
    """Whether a recipe key was written (recipe file or command line), not left at hpc-grpo's default."""
    node: Any = spec.recipe
    *parents, last = recipe_key.split(".")
    for part in parents:
        node = getattr(node, part, None)
        if node is None:
            return False
    return last in getattr(node, "model_fields_set", set())


def _typed_on_command_line(spec: RunSpec, key: str) -> str | None:
    for item in spec.overrides:
        typed = item.split("=", 1)[0].strip()
        if typed in (key, f"passthrough.{key}") or bare_key(typed) == bare_key(key):
            return item
    return None


def why(spec: RunSpec, source: str) -> str:
    """What an Override's source means for this run: the recipe key and where its value came from, the cluster
    profile, or hpc-grpo itself."""
    if source in CPU_SOURCES:
        return f"hpc-grpo CPU mode ({source.removeprefix('engine: ')})"
    if source == "engine" or source.startswith("engine:"):
        return "hpc-grpo engine" + (f" ({source.removeprefix('engine:').strip()})" if ":" in source else "")
    if source == "run directory":
        return "hpc-grpo (the run directory)"
    typed = _typed_on_command_line(spec, source)
    if typed is not None:
        return f"recipe key {source} (command line: {typed})"
    if source == "resources.gpus_per_node" and spec.recipe.resources.gpus_per_node is None:
        typed = _typed_on_command_line(spec, "cluster.gpus_per_node")
        return f"cluster profile {spec.cluster.name} (" + (f"command line: {typed}" if typed else
                                                           f"gpus_per_node {spec.cluster.gpus_per_node}") + ")"
    if source == "resources.cpu_workers_per_node" and not _set_explicitly(spec, source):
        return f"recipe key {source} (hpc-grpo's default; verl CPU mode)"
    return f"recipe key {source} (" + ("recipe file" if _set_explicitly(spec, source) else "hpc-grpo's default") + ")"


def sources(spec: RunSpec) -> dict[str, str]:
    """Rendered verl key -> why it is set, for every override hpc-grpo renders (modelled and passthrough)."""
    out = {bare_key(o.key): why(spec, o.source) for o in modelled_overrides(spec)}
    for key in spec.recipe.passthrough:
        typed = _typed_on_command_line(spec, key)
        out[bare_key(key)] = f"passthrough (command line: {typed})" if typed else "passthrough (recipe file)"
    return out


def _owner(key: str, owned: dict[str, str]) -> str | None:
    """The override that set a key: itself, or a parent set as a whole ({...} or a list)."""
    parts = key.split(".")
    for n in range(len(parts), 0, -1):
        hit = owned.get(".".join(parts[:n]))
        if hit is not None:
            return hit
    return None


def _follows(key: str, run_raw: dict[str, Any]) -> str:
    """A key no override set: it (or a section above it, taken whole) is one of verl's ${...} interpolations."""
    parts = key.split(".")
    for n in range(len(parts), 0, -1):
        raw = run_raw.get(".".join(parts[:n]))
        if _is_interpolation(raw):
            section = "" if n == len(parts) else f" (its section {'.'.join(parts[:n])})"
            return f"verl's interpolation {raw}{section}: follows the key it names"
    return "verl (its config derives it from another key)"


def diff_defaults(spec: RunSpec, config_dir: Path) -> list[Difference]:
    """Every leaf of the run's composed verl config that differs from verl's default, in key order."""
    cmd = VerlEngine().command(spec)
    default_raw, default = flat_config(_compose(cmd.config_name, [], config_dir))
    run_raw, run = flat_config(_compose(cmd.config_name, cmd.overrides, config_dir))
    owned = sources(spec)
    out: list[Difference] = []
    for key in sorted(set(default) | set(run)):
        was = MISSING if default_raw.get(key) == MISSING else default.get(key, ABSENT)
        now = run.get(key, ABSENT)
        if was == now:
            continue
        raw = default_raw.get(key)
        reason = _owner(key, owned) or _follows(key, run_raw)
        out.append(Difference(key, was, now, reason, raw if _is_interpolation(raw) else None))
    return out
