"""verl's own key names for the settings hpc-grpo models, derived from `modelled_overrides` (the one table).

A user who brings a verl launch script types `actor_rollout_ref.rollout.n=5`, not `grpo.n=5`. Each modelled
override names the recipe field it came from; when verl's value IS that field's value (no transform), typing the
verl key is the same as typing the recipe key, so it is translated. Whether the copy is exact is not written by
hand: it is probed by giving every recipe field another value and watching which verl keys follow it (a key that
follows only one way, e.g. emitted only when a flag is on, or a derived value like max_model_len, is not exact).
Every other modelled key is hpc-grpo's own: accepted when it equals what hpc-grpo sets, refused otherwise with the
setting that decides it.
"""

from __future__ import annotations

import types
import typing
from collections.abc import Iterator
from typing import Any, Literal

from pydantic import BaseModel

from hpc_grpo.common.yamlio import SpecError
from hpc_grpo.config.resolve import resolve_spec
from hpc_grpo.config.spec import RunSpec
from hpc_grpo.engines.base import Override
from hpc_grpo.engines.verl import OWN_SECTIONS, modelled_overrides, owned_conflicts
from hpc_grpo.config.verl_keys import KeyRoutes, bare_key, format_value


def _leaves(model: BaseModel, prefix: str = "") -> Iterator[tuple[str, BaseModel, str, Any, Any]]:
    """(dotted key, owning model, field name, value, annotation) of every leaf field of the recipe."""
    for name, field in type(model).model_fields.items():
        value = getattr(model, name)
        dotted = f"{prefix}{name}"
        if isinstance(value, BaseModel):
            yield from _leaves(value, f"{dotted}.")
        else:
            yield dotted, model, name, value, field.annotation


def _types(annotation: Any) -> tuple[Any, ...]:
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return typing.get_args(annotation)
    return (annotation,)


def _other_value(value: Any, annotation: Any, flag: bool) -> Any:
    """A value of the field's type unlike `value` (bools become `flag`); None when the field has no such value."""
    kinds = [t for t in _types(annotation) if t is not type(None)]
    for kind in kinds:
        if typing.get_origin(kind) is Literal:
            others = [v for v in typing.get_args(kind) if v != value]
            return others[0] if others else None
        if kind is bool:
            return flag
        if kind is int:
            return 7 if value is None else value + 3
        if kind is float:
            return 0.375 if value is None else value * 2 + 0.0625
        if kind is str:
            return "probe" if value is None else f"{value}-probe"
    return None


def _probe(spec: RunSpec, flag: bool) -> tuple[RunSpec, dict[str, Any]]:
    """A copy of the spec with every recipe field (but the backend, which picks the key set) changed."""
    copy = spec.model_copy(deep=True)
    changed: dict[str, Any] = {}
    for dotted, owner, name, value, annotation in list(_leaves(copy.recipe)):
        if dotted in ("backend", "engine", "name", "passthrough", "grpo.reward"):  # grpo.reward: a registry name
            continue
        new = _other_value(value, annotation, flag)
        if new is not None:
            object.__setattr__(owner, name, new)  # a probe only: never validated, never rendered
            changed[dotted] = new
    return copy, changed


def _follows(overrides: list[Override], changed: dict[str, Any]) -> dict[str, str]:
    """verl key -> recipe key for the overrides whose value is their source field's (changed) value."""
    return {bare_key(o.key): o.source for o in overrides if o.source in changed and o.value == changed[o.source]}


def inverse_map(spec: RunSpec) -> dict[str, str]:
    """verl key -> recipe key, for the modelled keys whose value is exactly one recipe field's, on this backend."""
    on_spec, on = _probe(spec, True)
    off_spec, off = _probe(spec, False)
    both_ways = _follows(modelled_overrides(on_spec), on)
    off_ways = _follows(modelled_overrides(off_spec), off)
    base = {bare_key(o.key): o for o in modelled_overrides(spec)}
    exact: dict[str, str] = {}
    for key, field in both_ways.items():
        # a flag must be followed both ways; any other field only where it is rendered (a key emitted only under
        # a flag, like ppo_max_token_len_per_gpu under dynamic_bsz, still copies its field exactly)
        if field.startswith(OWN_SECTIONS) or (isinstance(on[field], bool) and off_ways.get(key) != field):
            continue
        if key in base and base[key].source != field:  # another setting decides it here (verl's CPU mode)
            continue
        exact[key] = field
    return exact


def key_routes(spec: RunSpec) -> KeyRoutes:
    """What resolve does with a verl key typed for this spec: translate it, or drop it when hpc-grpo sets the same."""
    exact = inverse_map(spec)
    owned = {bare_key(o.key): format_value(o.value) for o in modelled_overrides(spec) if bare_key(o.key) not in exact}
    return KeyRoutes(translate=exact, owned=owned)


def resolve_with_verl_keys(recipe: str, cluster: str | None, overrides: list[str], run_name: str | None = None,
                           now: float | None = None) -> tuple[RunSpec, list[str]]:
    """resolve_spec, with verl's names of modelled keys translated (a verl recipe only), and one line per key it
    translated or dropped. Translating can change what hpc-grpo derives (grpo.n moves max_num_seqs), so the routes
    are derived again from the result until they stop changing."""
    spec = resolve_spec(recipe, cluster, overrides, run_name=run_name, now=now)
    if spec.recipe.engine != "verl" or not spec.recipe.passthrough:  # no verl key typed or in the recipe
        return spec, []
    routes = None
    notes: list[str] = []
    for _ in range(3):
        new = key_routes(spec)
        if new == routes:
            break
        routes, notes = new, []
        spec = resolve_spec(recipe, cluster, overrides, run_name=run_name, now=now, routes=routes, notes=notes)
    refusals = owned_conflicts(spec)
    if refusals:
        raise SpecError("; ".join(f"{key}: {message}. Fix: {fix}" for key, message, fix in refusals),
                        key="passthrough")
    return spec, notes

