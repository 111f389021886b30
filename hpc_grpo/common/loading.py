"""The object a "module:attribute" path names. The registries hold their functions as such strings (so config can
read them without importing a reward, a scorer or a data preparer); whoever calls one loads it here."""

from __future__ import annotations

from importlib import import_module
from typing import Any


def load_object(path: str) -> Any:
    """`module.sub:name` -> that attribute of the imported module. ValueError for a path without `:`."""
    module, sep, attr = path.partition(":")
    if not sep or not module or not attr:
        raise ValueError(f"{path!r} is not a 'module:attribute' path")
    return getattr(import_module(module), attr)
