"""recipe + cluster + key=value overrides -> a validated, frozen RunSpec.

Overrides are applied to the raw YAML data before validation, so a typo or a wrong type on the
command line gets the same "did you mean" error as one in a file.
"""

from __future__ import annotations

import copy
import sys
import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from hpc_grpo import __version__
from hpc_grpo.config import registry
from hpc_grpo.config.verl_keys import KeyRoutes, bare_key, format_value, is_engine_key, real_key_for
from hpc_grpo.config.cluster import Cluster, Setup
from hpc_grpo.config.fields import check_name
from hpc_grpo.config.keys import validation_error
from hpc_grpo.config.secrets import secret_error, secret_in
from hpc_grpo.config.spec import DataCfg, Recipe, RunSpec, default_run_name
from hpc_grpo.common.yamlio import SpecError, load_yaml_file, parse_scalar

DEFAULT_CLUSTER = "local"
MAX_EXTENDS = 8


def _deep_merge(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for key, value in top.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict) and key != "passthrough":
            out[key] = _deep_merge(out[key], value)
        elif key == "passthrough" and isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = {**out[key], **value}
        else:
            out[key] = copy.deepcopy(value)
    return out


def _origins(path: Path, lines: dict[str, int]) -> dict[str, str]:
    return {key: f"{path}:{line}" for key, line in lines.items()}


def load_raw(kind: str, name: str, chain: tuple[str, ...] = ()) -> tuple[dict[str, Any], dict[str, str]]:
    """Raw data of a recipe/cluster with `extends:` applied, and where each key was set."""
    path = registry.find(kind, name)
    data, lines = load_yaml_file(path)
    where = _origins(path, lines)
    parent = data.pop("extends", None)
    if parent is None:
        return data, where
    if not isinstance(parent, str):
        raise SpecError("must be the name of another recipe", key="extends", where=where.get("extends", str(path)))
    if parent in chain or parent == name or len(chain) >= MAX_EXTENDS:
        raise SpecError(
            f"'extends' forms a cycle or is too deep: {' -> '.join((*chain, name, parent))}",
            key="extends",
            where=where.get("extends", str(path)),
        )
    base, base_where = load_raw(kind, parent, (*chain, name))
    if kind == "recipes" and "name" in base and "name" not in data:
        data["name"] = registry.stem(name)  # a recipe goes by its own name, not its base's
    return _deep_merge(base, data), {**base_where, **where}


def _set_dotted(data: dict[str, Any], key: str, value: Any, origin: str) -> None:
    parts = key.split(".")
    node = data
    for i, part in enumerate(parts[:-1]):
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        if not isinstance(child, dict):
            section = ".".join(parts[: i + 1])
            raise SpecError(
                f"cannot set a sub-key: '{section}' is a value, not a section ({origin})",
                key=key,
            )
        node = child
    node[parts[-1]] = value


def _verl_data_key(key: str) -> bool:
    """`data.X` where X is no field of the recipe's data section: one of verl's own data keys (data.return_raw_chat,
    data.prompt_key...), passed through; the fields hpc-grpo models stay recipe keys."""
    section, _, rest = key.partition(".")
    return section == "data" and bool(rest) and rest.split(".", 1)[0] not in DataCfg.model_fields


def _get_dotted(data: dict[str, Any], key: str) -> Any:
    node: Any = data
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def _file_of(origin: str) -> str:
    return origin.rsplit(":", 1)[0]


def _route_verl_keys(rdata: dict[str, Any], rwhere: dict[str, str], passthrough: dict[str, Any],
                     recipe_items: list[tuple[str, Any]], routes: KeyRoutes, notes: list[str]) -> None:
    """verl keys that hpc-grpo models, from the recipe's passthrough block or the command line: a plain copy of a
    recipe key becomes that key; one hpc-grpo sets to the same value is dropped. A contradiction with the recipe key
    given in the same place (the same file, or the command line) is refused, naming both."""
    typed = dict(recipe_items)
    file_pass = rdata.get("passthrough") or {}
    for key, value in list(file_pass.items()):
        origin = rwhere.get(f"passthrough.{key}", "the recipe")
        target = routes.translate.get(bare_key(key))
        if target is not None:
            theirs = _get_dotted(rdata, target)
            if (target in rwhere and _file_of(rwhere[target]) == _file_of(origin) and theirs is not None
                    and format_value(theirs) != format_value(value)):
                raise SpecError(
                    f"passthrough.{key}={format_value(value)} ({origin}) contradicts {target}={format_value(theirs)} "
                    f"({rwhere[target]}): {bare_key(key)} is the verl name of {target}. Fix: keep one of them, {target} "
                    f"(hpc-grpo's name) or passthrough.{key}", key=target)
            del file_pass[key]
            _set_dotted(rdata, target, value, origin)
            rwhere[target] = origin
            notes.append(f"{key}={format_value(value)} -> {target}={format_value(value)} (passthrough at {origin})")
        elif routes.owned.get(bare_key(key)) == format_value(value):
            del file_pass[key]
            notes.append(f"{key}={format_value(value)}: hpc-grpo sets the same; dropped (passthrough at {origin})")
    for key, value in list(passthrough.items()):
        target = routes.translate.get(bare_key(key))
        if target is not None:
            if target in typed and format_value(typed[target]) != format_value(value):
                raise SpecError(
                    f"{key}={format_value(value)} and {target}={format_value(typed[target])} are both on the command "
                    f"line and disagree: {bare_key(key)} is the verl name of {target}. Fix: keep one of them ({target} is "
                    "hpc-grpo's name)", key=target)
            del passthrough[key]
            if target not in typed:
                recipe_items.insert(0, (target, value))
            notes.append(f"{key}={format_value(value)} -> {target}={format_value(value)}")
        elif routes.owned.get(bare_key(key)) == format_value(value):
            del passthrough[key]
            notes.append(f"{key}={format_value(value)}: hpc-grpo sets the same; dropped")


def split_overrides(overrides: list[str]) -> tuple[list[tuple[str, Any]], list[tuple[str, Any]], dict[str, Any]]:
    """Sort `key=value` items into recipe keys, cluster keys and engine passthrough keys."""
    recipe_items: list[tuple[str, Any]] = []
    cluster_items: list[tuple[str, Any]] = []
    passthrough: dict[str, Any] = {}
    for item in overrides:
        if "=" not in item:
            raise SpecError(f"override {item!r} is not key=value (example: parallel.tp=4)", key=item)
        key, raw = item.split("=", 1)
        key = key.strip()
        if not key:
            raise SpecError(f"override {item!r} has an empty key", key=item)
        if key.startswith("--"):
            raise SpecError(
                f"'{key}' is not how Hydra or hpc-grpo take keys: drop the leading '--' ({key[2:]}=...)",
                key=key,
            )
        value = parse_scalar(raw)
        secret = secret_in(key, value)
        if secret:
            raise secret_error(secret)
        if key.startswith("passthrough."):
            passthrough[key.removeprefix("passthrough.")] = value
        elif key.startswith("cluster."):
            cluster_items.append((key.removeprefix("cluster."), value))
        elif is_engine_key(key) or real_key_for(key) is not None or _verl_data_key(key):
            passthrough[key] = value
        else:
            recipe_items.append((key, value))
    return recipe_items, cluster_items, passthrough


def _validate(model: type[BaseModel], data: dict[str, Any], where: dict[str, str], prefix: str = "") -> Any:
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise validation_error(exc, model, where, prefix) from None


def resolve_spec(
    recipe: str,
    cluster: str | None = None,
    overrides: list[str] | None = None,
    run_name: str | None = None,
    now: float | None = None,
    routes: KeyRoutes | None = None,
    notes: list[str] | None = None,
) -> RunSpec:
    """Load, merge and validate everything a run needs; raises SpecError on any bad input.

    `routes` (engines.verl_keymap.resolve_with_verl_keys derives them) translates verl's names of modelled keys;
    what it did is appended to `notes`, one line each."""
    overrides = list(overrides or [])
    recipe_items, cluster_items, passthrough = split_overrides(overrides)

    rdata, rwhere = load_raw("recipes", recipe)
    if routes is not None:
        _route_verl_keys(rdata, rwhere, passthrough, recipe_items, routes, notes if notes is not None else [])
    for key, value in recipe_items:
        if key in ("name", "extends"):
            raise SpecError(f"'{key}' cannot be overridden from the command line", key=key)
        _set_dotted(rdata, key, value, "command line")
        rwhere[key] = "command line"
    if passthrough:
        merged = dict(rdata.get("passthrough") or {})
        merged.update(passthrough)
        rdata["passthrough"] = merged
    rdata.setdefault("name", registry.stem(recipe))
    recipe_model: Recipe = _validate(Recipe, rdata, rwhere)

    cluster_name = cluster or DEFAULT_CLUSTER
    cdata, cwhere = load_raw("clusters", cluster_name)
    for key, value in cluster_items:
        _set_dotted(cdata, key, value, "command line")
        cwhere[key] = "command line"
    cdata.setdefault("name", registry.stem(cluster_name))
    cluster_model: Cluster = _validate(Cluster, cdata, cwhere, prefix="cluster.")

    name = check_name(run_name, "run") if run_name else default_run_name(recipe_model.name, now)
    run_dir = cluster_model.runs_root_path() / name
    return RunSpec(
        version=__version__,
        run_name=name,
        run_dir=str(run_dir),
        created=time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(now)),
        recipe=recipe_model,
        cluster=cluster_model,
        python=job_python(cluster_model.setup),
        overrides=overrides,
    )


def job_python(setup: Setup) -> str:
    """The interpreter a job runs, decided once and frozen in spec.yaml.

    A compute node's PATH may hold another python3 than the one that submitted (pipx, a venv not activated there):
    `setup.python`, else the profile's venv, else python3 of its conda env or container (activated before any step),
    else the submitting interpreter, which must then be reachable at the same path on the compute nodes.
    """
    if setup.python:
        return setup.python
    if setup.venv:
        return f"{setup.venv}/bin/python"
    if setup.conda or setup.container:
        return "python3"
    return sys.executable


def load_frozen(path: Path) -> RunSpec:
    """Read back a run's frozen spec (spec.yaml), validated as it was at submit: a key this version no longer has is
    refused with the key that replaced it (config.keys.ALIASES), never dropped."""
    data, lines = load_yaml_file(path)
    return _validate(RunSpec, data, _origins(path, lines))
