"""YAML loading that remembers where every key came from, so errors can say `file:line`.

pyyaml's safe loader drops positions once it has built Python objects; we walk the node tree
once ourselves and keep a map from dotted key path to line number beside the data.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml


class SpecError(ValueError):
    """Invalid user input (a recipe, a cluster profile or an override). The CLI exits 2 on it."""

    def __init__(self, message: str, key: str = "", where: str = "") -> None:
        self.key = key
        self.where = where
        self.message = message  # without the key and place: for a finding, which prints its key itself
        prefix = f"{where}: " if where else ""
        keypart = f"{key}: " if key and not message.startswith(key) else ""
        super().__init__(f"{prefix}{keypart}{message}")


_Base = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml when present: 5-10x faster to parse


class _LineLoader(_Base):  # type: ignore[misc, valid-type]
    """SafeLoader that refuses duplicate keys (a silent overwrite is a classic recipe bug)."""


def _construct_mapping(loader: _LineLoader, node: yaml.MappingNode, deep: bool = False) -> dict:
    seen: set[Any] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r}", key_node.start_mark
            )
        seen.add(key)
    return yaml.constructor.SafeConstructor.construct_mapping(loader, node, deep=deep)


def _construct_number(loader: _LineLoader, node: yaml.ScalarNode) -> Any:
    """YAML 1.1 reads `3:00:00` as the base-60 integer 10800; YAML 1.2 dropped that, and here a colon in a number
    is a Slurm time (`resources.time: 3:00:00`): keep it as the string the user wrote."""
    if ":" in str(node.value):
        return loader.construct_scalar(node)
    if node.tag.endswith(":int"):
        return yaml.constructor.SafeConstructor.construct_yaml_int(loader, node)
    return yaml.constructor.SafeConstructor.construct_yaml_float(loader, node)


_LineLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)
_LineLoader.add_constructor("tag:yaml.org,2002:int", _construct_number)
_LineLoader.add_constructor("tag:yaml.org,2002:float", _construct_number)


def _record_lines(node: yaml.Node, prefix: str, lines: dict[str, int]) -> None:
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            path = f"{prefix}.{key_node.value}" if prefix else str(key_node.value)
            lines[path] = key_node.start_mark.line + 1
            _record_lines(value_node, path, lines)


def load_yaml_file(path: Path) -> tuple[dict[str, Any], dict[str, int]]:
    """Load a YAML mapping; return (data, {dotted.key: line}). Raises SpecError with file:line."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise SpecError("file not found", where=str(path)) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise SpecError(f"cannot read file: {exc}", where=str(path)) from None
    loader = _LineLoader(text)
    try:
        node = loader.get_single_node()
        data = loader.construct_document(node) if node is not None else None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = f":{mark.line + 1}" if mark else ""
        raise SpecError(f"malformed YAML: {exc.problem or exc}", where=f"{path}{line}") from None
    except yaml.YAMLError as exc:
        raise SpecError(f"malformed YAML: {exc}", where=str(path)) from None
    finally:
        loader.dispose()
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise SpecError(
            f"the top level must be a mapping of keys, got {type(data).__name__}", where=str(path)
        )
    lines: dict[str, int] = {}
    if node is not None:
        _record_lines(node, "", lines)
    return data, lines


def parse_scalar(text: str) -> Any:
    """Type a command-line value the way YAML would (`4` -> int, `true` -> bool, `[a,b]` -> list)."""
    if text == "":
        return ""
    try:
        return yaml.load(text, Loader=_LineLoader)
    except yaml.YAMLError:
        return text


def dump_yaml(data: Any) -> str:
    return yaml.safe_dump(data, sort_keys=False, default_flow_style=False, allow_unicode=False)
