"""Engines: everything hpc-grpo knows about one training framework lives in its module.

An engine turns a RunSpec into the command that trains (`command`), checks it, carries its traits
(config/engine_traits: what callers ask instead of comparing names), names the launch template
its job runs, and says which Hydra/CLI keys it owns. `get_engine(name)` is the only lookup; the types every engine
returns are in engines/base.py.
"""

from __future__ import annotations

from collections.abc import Callable

from hpc_grpo.config.engine_traits import ENGINE_NAMES
from hpc_grpo.engines.base import Engine


def _verl() -> Engine:
    from hpc_grpo.engines.verl import VerlEngine

    return VerlEngine()


def _trl() -> Engine:
    from hpc_grpo.engines.trl import TrlEngine

    return TrlEngine()


# Engine name -> its factory; the modules load on first use so a trl plan never imports verl's tables.
FACTORIES: dict[str, Callable[[], Engine]] = {"verl": _verl, "trl": _trl}


def get_engine(name: str) -> Engine:
    """The engine of a recipe's `engine` key: the only lookup."""
    factory = FACTORIES.get(name)
    if factory is None:
        raise ValueError(f"unknown engine {name!r}: use {' or '.join(ENGINE_NAMES)}")
    return factory()
