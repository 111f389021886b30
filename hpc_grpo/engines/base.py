"""What every engine module returns: one setting (Override), the driver invocation (EngineCommand), and the
Engine protocol. Its own module so the engine modules (verl, trl) import it without importing the package that
looks them up (hpc_grpo.engines.get_engine): that was an import cycle."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from hpc_grpo.common.findings import Finding
from hpc_grpo.config.engine_traits import EngineTraits
from hpc_grpo.config.spec import RunSpec
from hpc_grpo.runstate.checkpoints import Checkpoint


@dataclass(frozen=True, slots=True)
class Override:
    """One engine setting: its key, its value, and the recipe field it came from."""

    key: str
    value: Any
    source: str


@dataclass(frozen=True, slots=True)
class EngineCommand:
    """The exact driver invocation: argv plus, for Hydra engines, config name and overrides."""

    argv: list[str]
    config_name: str = ""
    overrides: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    # Ray engines: the logical CPUs each node's `ray start --num-cpus` offers (0: no Ray).
    ray_cpus: int = 0
    # Exported on every node before Ray starts, so every process of the job has it (verl's CPU-mode plugin).
    node_env: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class JobImports:
    """What the job's interpreter must import for the job to start, so preflight can try it before queueing
    (hpc_grpo.planning.interpreter): the modules, the environment the job imports them under, the fix when one
    is missing, and the venv of this checkout that has the engine's stack (tools/setup-env.sh builds it)."""

    modules: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    fix: str = ""
    checkout_venv: str = ""


class Engine(Protocol):
    """Everything engine-specific that code outside engines/ asks: its facts (`traits`, plain data in
    config/engine_traits so layers below engines/ can read them by name) and what it derives from a spec or a
    checkpoint. Callers ask `get_engine(spec.recipe.engine)`, never compare engine names."""

    name: str
    launch_template: str
    traits: EngineTraits

    def command(self, spec: RunSpec) -> EngineCommand: ...

    def check(self, spec: RunSpec) -> list[Finding]: ...

    def job_imports(self, spec: RunSpec) -> JobImports: ...

    def resume_overrides(self, step_folder: Path | None) -> list[str]:
        """The driver's extra arguments that resume from step_folder (None: start fresh); [] when the engine finds
        its checkpoint itself."""
        ...

    def checkpoint_world_size(self, ckpt: Checkpoint) -> int | None:
        """The world size a checkpoint must be loaded at (it does not reshard), or None when any size loads it."""
        ...

    def lora_targets_unchecked(self, spec: RunSpec) -> str:
        """Why the LoRA target names cannot be checked against the model's Hugging Face weights ("" when they can):
        the names the engine matches them against."""
        ...
