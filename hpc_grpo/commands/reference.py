"""The field reference: every recipe and cluster-profile key, its type, default, rule and description, read from the
pydantic models where each field is declared (config.spec, config.cluster), so the page and the code cannot disagree.

`hpc-grpo recipes --reference` prints it; the shipped one is docs/reference.md, which a unit test regenerates and
compares (as docs/recipe-matrix.md).
"""

from __future__ import annotations

import json
import types
from collections.abc import Iterator
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from annotated_types import Ge, Gt, Le, Lt, MaxLen, MinLen
from pydantic import BaseModel
from pydantic.fields import FieldInfo

from hpc_grpo.config.cluster import Cluster
from hpc_grpo.config.spec import Recipe, RunSpec
from hpc_grpo.runstate.layout import SPEC_FILE

HEADER = f"""# Field reference

Every key of a recipe (`recipes/*.yaml`), a cluster profile (`clusters/*.yaml`) and the frozen spec of a run
(`RUN/{SPEC_FILE}`): its type, default, rule and what it does. Set a recipe key on the command line as `section.key=value`
and a profile key as `cluster.key=value`. Generated from the models that declare the fields (`hpc_grpo/config/spec.py`,
`hpc_grpo/config/cluster.py`) by `hpc-grpo recipes --reference > docs/reference.md` (do not edit by hand; a unit test
regenerates it and fails when it differs). Which recipe plans on which profile: [recipe-matrix.md](recipe-matrix.md).
"""

# (title, the key prefix a user types, the model): the top of each tree; nested models get their own table.
ROOTS: tuple[tuple[str, str, type[BaseModel]], ...] = (
    ("Recipe", "", Recipe),
    ("Cluster profile", "cluster.", Cluster),
    (f"Frozen spec ({SPEC_FILE})", "", RunSpec),
)


def _strip(ann: Any) -> Any:
    """The type under Annotated[...]."""
    while get_origin(ann) is Annotated:
        ann = get_args(ann)[0]
    return ann


def _union_args(ann: Any) -> tuple[Any, ...] | None:
    return get_args(ann) if get_origin(ann) in (Union, types.UnionType) else None


def nested_models(ann: Any) -> list[type[BaseModel]]:
    """The models a field's type holds (itself, or inside a list or an optional)."""
    ann = _strip(ann)
    if isinstance(ann, type) and issubclass(ann, BaseModel):
        return [ann]
    return [m for arg in get_args(ann) for m in nested_models(arg)]


def type_name(ann: Any) -> str:
    """A field's type as a recipe writer reads it."""
    ann = _strip(ann)
    union = _union_args(ann)
    if union is not None:
        names = [type_name(a) for a in union if a is not type(None)]
        return " or ".join(names) + (" or null" if type(None) in union else "")
    if get_origin(ann) is Literal:
        return " \\| ".join(f"`{json.dumps(v)}`" for v in get_args(ann))
    if get_origin(ann) is list:
        return f"list of {type_name(get_args(ann)[0])}"
    if get_origin(ann) is dict:
        key, value = get_args(ann)
        return f"mapping {type_name(key)} -> {type_name(value)}"
    if isinstance(ann, type) and issubclass(ann, BaseModel):
        return "section"
    return {str: "text", int: "integer", float: "number", bool: "boolean", Any: "any"}.get(ann, str(ann))


def default_text(field: FieldInfo) -> str:
    if field.is_required():
        return "required"
    if field.default_factory is not None:
        value = field.default_factory()  # type: ignore[call-arg]
    else:
        value = field.default
    if isinstance(value, BaseModel):
        return "(section)"
    return f"`{json.dumps(value)}`"


RULES = ((Gt, "gt", "> {}"), (Ge, "ge", ">= {}"), (Lt, "lt", "< {}"), (Le, "le", "<= {}"),
         (MinLen, "min_length", "at least {} long"), (MaxLen, "max_length", "at most {} long"))


def rule_text(field: FieldInfo) -> str:
    """The numeric and length bounds pydantic enforces on the value (other rules are in the description)."""
    out = []
    for item in field.metadata:
        for kind, attr, text in RULES:
            if isinstance(item, kind):
                out.append(text.format(getattr(item, attr)))
    return ", ".join(out)


def walk(model: type[BaseModel], prefix: str) -> Iterator[tuple[str, type[BaseModel]]]:
    """(key prefix, model) for `model` and every model nested in it, depth first, each once."""
    yield prefix, model
    for name, field in model.model_fields.items():
        for sub in dict.fromkeys(nested_models(field.annotation)):
            yield from walk(sub, f"{prefix}{name}.")


def all_models() -> dict[type[BaseModel], str]:
    """Every model of a recipe, a profile and a frozen spec, with the first key prefix it appears under."""
    seen: dict[type[BaseModel], str] = {}
    for _, prefix, root in ROOTS:
        for at, model in walk(root, prefix):
            seen.setdefault(model, at)
    return seen


def undocumented() -> list[str]:
    """'prefix.key (Model)' for every field without a description."""
    return [f"{prefix}{name} ({model.__name__})" for model, prefix in all_models().items()
            for name, field in model.model_fields.items() if not (field.description or "").strip()]


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def table(model: type[BaseModel], prefix: str) -> list[str]:
    lines = ["| key | type | default | rule | description |", "|---|---|---|---|---|"]
    for name, field in model.model_fields.items():
        lines.append(f"| `{prefix}{name}` | {type_name(field.annotation)} | {default_text(field)} | "
                     f"{rule_text(field)} | {_cell(field.description or '')} |")
    return lines


def to_markdown() -> str:
    """The whole page: one section per root, one table per model under it (a model already shown is not repeated)."""
    lines = [HEADER]
    shown: set[type[BaseModel]] = set()
    for title, prefix, root in ROOTS:
        lines += [f"## {title}", ""]
        for at, model in walk(root, prefix):
            if model in shown:
                continue
            shown.add(model)
            doc = " ".join((model.__doc__ or "").strip().split("\n\n")[0].split())
            heading = f"`{at.rstrip('.')}`" if at else "top level"
            lines += [f"### {heading}", "", doc, "", *table(model, at), ""]
    return "\n".join(lines).rstrip("\n") + "\n"
