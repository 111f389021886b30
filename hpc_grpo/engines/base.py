"""What every engine module returns: one setting (Override), the driver invocation (EngineCommand), and the
Engine protocol. Its own module so the engine modules (verl, trl) import it without importing the package that
looks them up (hpc_grpo.engines.get_engine): that was an import cycle."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from hpc_grpo.common.findings import Finding
from hpc_grpo.config.spec import RunSpec


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
    name: str
    launch_template: str

    def command(self, spec: RunSpec) -> EngineCommand: ...

    def check(self, spec: RunSpec) -> list[Finding]: ...

    def job_imports(self, spec: RunSpec) -> JobImports: ...
