"""Engines: everything hpc-grpo knows about one training framework lives in its module.

An engine turns a RunSpec into the command that trains (`command`), names the launch template
its job runs, and says which Hydra/CLI keys it owns. `get_engine(name)` is the only lookup; the types every engine
returns are in engines/base.py.
"""

from __future__ import annotations

from hpc_grpo.engines.base import Engine


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
