"""A sweep's members from its command line: which `key=[a,b,...]` items are axes, and the grid (or K random
members of it) they span.

A bracketed value is an axis unless the key is a recipe field that holds a list itself (eval.tasks, launch.driver,
logging.logger...): there the brackets are the field's own value, shared by every member. Values are kept as typed,
one `key=value` override per member and axis, so each member is resolved and checked exactly as `submit` would
resolve the same command line.
"""

from __future__ import annotations

import itertools
import random
import typing
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from hpc_grpo.common.yamlio import SpecError
from hpc_grpo.config.spec import Recipe

MAX_MEMBERS = 1000  # Slurm's default MaxArraySize is 1001 (indices 0-1000)


@dataclass(frozen=True, slots=True)
class Grid:
    base: list[str]  # overrides every member shares
    axes: dict[str, list[str]]  # key -> its values as typed, in order

    @property
    def size(self) -> int:
        n = 1
        for values in self.axes.values():
            n *= len(values)
        return n


def _field_annotation(key: str) -> Any:
    """The type of the recipe field `key` (dotted), or None when it is no recipe field (a verl key, passthrough)."""
    model: Any = Recipe
    annotation: Any = None
    for part in key.split("."):
        if not (isinstance(model, type) and issubclass(model, BaseModel)) or part not in model.model_fields:
            return None
        annotation = model.model_fields[part].annotation
        model = next((a for a in (annotation, *typing.get_args(annotation))
                      if isinstance(a, type) and issubclass(a, BaseModel)), None)
    return annotation


def _holds_list(annotation: Any) -> bool:
    kinds = (annotation, *typing.get_args(annotation))
    return any(typing.get_origin(k) in (list, tuple) or k in (list, tuple) for k in kinds)


def _split_top(text: str) -> list[str]:
    """`a, [b,c], d` -> ["a", "[b,c]", "d"]: commas inside brackets or braces stay."""
    parts, depth, cur = [], 0, ""
    for ch in text:
        if ch in "[{":
            depth += 1
        elif ch in "]}":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(cur.strip())
            cur = ""
        else:
            cur += ch
    parts.append(cur.strip())
    return parts


def split_axes(overrides: list[str]) -> Grid:
    """Sort the command line's overrides into the shared ones and the axes; SpecError for an empty or repeated axis."""
    base: list[str] = []
    axes: dict[str, list[str]] = {}
    for item in overrides:
        key, sep, raw = item.partition("=")
        key, raw = key.strip(), raw.strip()
        if not sep or not (raw.startswith("[") and raw.endswith("]")) or _holds_list(_field_annotation(key)):
            base.append(item)
            continue
        values = [v for v in _split_top(raw[1:-1]) if v != ""]
        if not values:
            raise SpecError(f"{raw!r} sweeps no value: list at least one, e.g. {key}=[1e-6,3e-6]", key=key)
        if len(set(values)) != len(values):
            raise SpecError(f"{raw!r} lists a value twice: each member must differ", key=key)
        if key in axes:
            raise SpecError(f"{key} is swept twice: give all its values in one list", key=key)
        axes[key] = values
    return Grid(base, axes)


def members(grid: Grid, random_k: int | None = None, seed: int = 0) -> list[list[str]]:
    """Each member's own overrides (one key=value per axis): the whole grid in order, or `random_k` distinct members
    of it drawn with `seed` (the same seed draws the same members)."""
    if not grid.axes:
        raise SpecError("no axis to sweep: give at least one key=[a,b,...] (e.g. 'grpo.lr=[1e-6,3e-6]')", key="sweep")
    combos = [list(c) for c in itertools.product(*([f"{k}={v}" for v in vs] for k, vs in grid.axes.items()))]
    if random_k is not None:
        if not 1 <= random_k <= len(combos):
            raise SpecError(f"--random {random_k} asks for more members than the grid's {len(combos)} (or fewer than 1): "
                            f"give at most {len(combos)}, or add values to an axis", key="--random")
        picked = sorted(random.Random(seed).sample(range(len(combos)), random_k))
        combos = [combos[i] for i in picked]
    if len(combos) > MAX_MEMBERS:
        raise SpecError(f"{len(combos)} members: more than one job array holds ({MAX_MEMBERS}); use --random K or "
                        "fewer values", key="sweep")
    return combos
