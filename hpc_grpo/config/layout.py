"""The layout of a run: world size, GPUs per node and the parallel sizes, derived from the RunSpec, that every
check (planning's and the engines' own) and the plan table use."""

from __future__ import annotations

from dataclasses import dataclass

from hpc_grpo.config.spec import RunSpec


@dataclass
class Layout:
    """The numbers every other check and the plan table use."""

    world_size: int
    gpus_per_node: int
    tp: int
    pp: int
    cp: int
    ep: int
    dp: int
    rollout_tp: int


def layout_of(spec: RunSpec) -> Layout:
    r = spec.recipe
    p = r.parallel
    mp = p.tp * p.pp * p.cp if r.backend == "megatron" else 1
    world = spec.world_size
    return Layout(
        world_size=world,
        gpus_per_node=spec.gpus_per_node,
        tp=p.tp,
        pp=p.pp,
        cp=p.cp,
        ep=p.ep,
        dp=world // mp if mp and world % mp == 0 else 0,
        rollout_tp=p.rollout_tp,
    )
