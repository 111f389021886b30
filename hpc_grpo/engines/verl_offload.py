"""What the pinned verl will move to the CPU, read from the keys main_ppo gets (recipe keys and passthrough keys alike),
so the memory estimate counts a flag typed as verl's own key exactly as it counts the recipe's `offload.*`.

What each key does (read in the pinned verl and megatron-core):

* `actor.{megatron,fsdp_config}.param_offload` / `optimizer_offload` (recipe: offload.param / offload.optimizer):
  verl parks the state on the CPU while vLLM generates and loads it back for the update; the training peak stays.
* Megatron `actor.optim.override_optimizer_config.optimizer_cpu_offload=True`: verl copies override_optimizer_config
  into megatron-core's OptimizerConfig (verl/utils/megatron/optimizer.py), which then builds its HybridDeviceOptimizer:
  the first `optimizer_offload_fraction` of the parameters get their fp32 master copy and Adam moments and their step
  on the CPU; the rest stay on the GPU. megatron-core's default fraction is 0.0 (verl sets none), so the flag alone
  moves nothing: with it, `optimizer_offload_fraction=1.0` offloads the whole optimizer.
* FSDP `actor.fsdp_config.offload_policy=True` with `actor.strategy=fsdp2`: FSDP2's CPUOffloadPolicy keeps params,
  grads and the optimizer on the CPU through the update (verl ignores it under strategy fsdp).

Stdlib only (on the path of `hpc-grpo plan`).
"""

from __future__ import annotations

from dataclasses import dataclass

from hpc_grpo.config.spec import RunSpec
from hpc_grpo.config.verl_keys import OPTIMIZER_OVERRIDE

ARR = "actor_rollout_ref"
CPU_OFFLOAD_KEY = f"{OPTIMIZER_OVERRIDE}.optimizer_cpu_offload"
FRACTION_KEY = f"{OPTIMIZER_OVERRIDE}.optimizer_offload_fraction"
MCORE_DEFAULT_FRACTION = 0.0  # megatron-core OptimizerConfig.optimizer_offload_fraction
OFFLOAD_POLICY_KEY = f"{ARR}.actor.fsdp_config.offload_policy"
STRATEGY_KEY = f"{ARR}.actor.strategy"


def engine_block(backend: str) -> str:
    """verl's section for the training engine's own settings."""
    return "megatron" if backend == "megatron" else "fsdp_config"


def offload_key(backend: str, role: str, knob: str) -> str:
    """verl's key for one of the engine's offload switches (`param_offload`, `optimizer_offload`)."""
    return f"{ARR}.{role}.{engine_block(backend)}.{knob}"


@dataclass(frozen=True)
class Offloads:
    """What verl will keep on the CPU: the idle-time switches and the share of the optimizer that trains on the CPU."""

    param: bool
    optimizer: bool
    ref_param: bool
    train_fraction: float  # 0..1: share of the optimizer (FSDP2 policy: all of params, grads, optimizer) on the CPU
    cpu_offload_typed: bool  # Megatron's optimizer_cpu_offload is set True (whatever the fraction)
    fraction_typed: bool  # optimizer_offload_fraction is set


def as_bool(value: object) -> bool:
    """A verl boolean as main_ppo will read it (Hydra turns `true`/`True` into a bool; a string may slip through)."""
    if isinstance(value, str):
        return value.strip().lower() in ("true", "1", "yes")
    return bool(value)


def as_fraction(value: object, default: float) -> float:
    try:
        return min(1.0, max(0.0, float(value)))  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return default


def read_offloads(spec: RunSpec) -> Offloads:
    """The offloads of `spec`, each read from the composed value of verl's key (never the recipe field beside it)."""
    from hpc_grpo.engines.verl import composed

    values = composed(spec)
    backend = spec.recipe.backend
    param = as_bool(values.get(offload_key(backend, "actor", "param_offload"), False))
    optimizer = as_bool(values.get(offload_key(backend, "actor", "optimizer_offload"), False))
    ref_param = as_bool(values.get(offload_key(backend, "ref", "param_offload"), False))
    typed_cpu = backend == "megatron" and as_bool(values.get(CPU_OFFLOAD_KEY, False))
    typed_fraction = FRACTION_KEY in values
    if backend == "megatron":
        fraction = as_fraction(values.get(FRACTION_KEY), MCORE_DEFAULT_FRACTION) if typed_cpu else 0.0
    else:
        policy = as_bool(values.get(OFFLOAD_POLICY_KEY, False)) and values.get(STRATEGY_KEY) == "fsdp2"
        fraction = 1.0 if policy else 0.0
    return Offloads(param=param, optimizer=optimizer, ref_param=ref_param, train_fraction=fraction,
                    cpu_offload_typed=typed_cpu, fraction_typed=typed_fraction)
