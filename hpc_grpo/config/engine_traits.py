"""What each engine is, as plain data: the facts layers below engines/ need (config's CPU mode, runstate's
checkpoint formats, trackers and metric files) and the simple yes/no rules planning, launch, the job and the
commands ask. engines/ sits above config and runstate in the import rule, so these facts cannot live there;
each Engine object carries its row (`get_engine(name).traits`), and config/runstate look the row up by name here.
What an engine does with a spec (its command, its checks, its resume overrides) stays in engines/."""

from __future__ import annotations

from dataclasses import dataclass

DataColumns = tuple[tuple[str, ...], ...]


@dataclass(frozen=True, slots=True)
class EngineTraits:
    """One engine's facts. Each field is asked by the code that needs it, never by comparing engine names."""

    name: str
    # resources.nodes > 1 is possible (verl spreads over Ray; trl's job is one process).
    multi_node: bool
    # Given no GPU, the engine runs its own CPU mode with resources.cpu_workers_per_node workers (verl_cpu);
    # without one, a CPU run is the engine as it is (trl's use_cpu).
    cpu_mode: bool
    # Which completeness rules of runstate/checkpoints judge its checkpoints (the folder names are spelled there):
    # "verl" (FSDP or Megatron actor folders) or "hf-trainer" (transformers' Trainer: trainer_state.json last).
    checkpoint_format: str
    # A tracker file beside the checkpoints that names the step to resume from (verl's), kept in step by resume
    # preparation and protected by prune.
    step_tracker: bool
    # Each checkpoint carries the metric history (trainer_state.json's log_history), a metric source for prune.
    metrics_in_checkpoints: bool
    # The driver prints its metric lines on the console: status reads the job logs when metrics.jsonl is short.
    metrics_on_console: bool
    # On USR2 the trainer saves at the next step end; the submitit handler waits for that save before requeueing.
    saves_on_signal: bool
    # The columns its data loader reads (each inner tuple lists alternatives), how messages name the files, and
    # the suffix of the file `hpc-grpo data` writes for it.
    data_columns: DataColumns
    data_layout: str
    data_suffix: str
    # It is configured through a Hydra config with a schema and defaults plan can check and diff.
    hydra_config: bool
    # Why plan checks no config schema (empty when it does).
    no_schema_note: str
    # Plan models its step time (the schedule's steps-per-time-limit estimate).
    step_time_model: bool
    # The job can save and stop between two steps on its own decision (a sweep's successive halving, early stop).
    stops_between_steps: bool


VERL = EngineTraits(
    name="verl", multi_node=True, cpu_mode=True,
    checkpoint_format="verl",
    step_tracker=True, metrics_in_checkpoints=False, metrics_on_console=True, saves_on_signal=False,
    # RLHFDataset's prompt_key plus what its reward manager reads (data_source picks the scorer,
    # reward_model.ground_truth is the answer).
    data_columns=(("prompt",), ("data_source",), ("reward_model",)), data_layout="verl's parquet", data_suffix=".parquet",
    hydra_config=True, no_schema_note="", step_time_model=True, stops_between_steps=False,
)
TRL = EngineTraits(
    name="trl", multi_node=False, cpu_mode=False,
    checkpoint_format="hf-trainer",
    step_tracker=False, metrics_in_checkpoints=True, metrics_on_console=False, saves_on_signal=True,
    # The job's loader (job/trl_job.py) takes `ground_truth`, or derives it from verl's `reward_model`.
    data_columns=(("prompt",), ("ground_truth", "reward_model")), data_layout="trl's jsonl", data_suffix=".jsonl",
    hydra_config=False, no_schema_note="trl: GRPOConfig is built and checked in the job", step_time_model=False,
    stops_between_steps=True,
)
TRAITS: dict[str, EngineTraits] = {t.name: t for t in (VERL, TRL)}
ENGINE_NAMES: tuple[str, ...] = tuple(TRAITS)


def traits_of(engine: str) -> EngineTraits:
    """The row of one engine; a ValueError that names the known engines for any other name."""
    try:
        return TRAITS[engine]
    except KeyError:
        raise ValueError(f"unknown engine {engine!r}: use {' or '.join(ENGINE_NAMES)}") from None
