"""Engines: everything hpc-grpo knows about one training framework lives in its module.

An engine turns a RunSpec into the command that trains (`command`), names the launch template
its job runs, and says which Hydra/CLI keys it owns. `get_engine(name)` is the only lookup.
"""

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


class Engine(Protocol):
    name: str
    launch_template: str

    def command(self, spec: RunSpec) -> EngineCommand: ...

    def check(self, spec: RunSpec) -> list[Finding]: ...


def get_engine(name: str) -> Engine:
    if name == "verl":
        from hpc_grpo.engines.verl import VerlEngine

        return VerlEngine()
    if name == "trl":
        from hpc_grpo.engines.trl import TrlEngine

        return TrlEngine()
    raise ValueError(f"unknown engine {name!r}: use verl or trl")


# The columns each engine's data loader reads from the train and val files; each inner tuple lists alternatives
# (any one suffices). verl: RLHFDataset's prompt_key plus what its reward manager reads (data_source picks the
# scorer, reward_model.ground_truth is the answer). trl: the job's loader (job/trl_job.py) takes `ground_truth`,
# or derives it from verl's `reward_model`.
DATA_COLUMNS: dict[str, tuple[tuple[str, ...], ...]] = {
    "verl": (("prompt",), ("data_source",), ("reward_model",)),
    "trl": (("prompt",), ("ground_truth", "reward_model")),
}
