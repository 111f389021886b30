"""What verl's config does and does not have, beyond what the adapter sets.

Guides and blog posts for GRPO on verl are what users paste: their flags look like verl's but many are not.
Each entry maps such a key to what verl really uses, so the error says the fix, not just "unknown".
Checked against the pinned verl's config (verl/trainer/config/ppo_trainer.yaml and its groups).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

# The verl release hpc-grpo is built and tested against, the one place Python spells it: pyproject.toml's
# train-verl pin and tools/setup-env.sh's verl_version must equal it (tests/unit/test_one_value.py).
VERL_VERSION = "0.9.1"

# Top-level sections of verl's ppo_trainer config; a command-line key under one of these goes to
# the recipe's passthrough block.
VERL_SECTIONS = (
    "actor_rollout_ref",
    "algorithm",
    "critic",
    "reward_model",
    "reward",
    "custom_reward_function",
    "trainer",
    "ray_kwargs",
    "global_profiler",
)

NOT_IN_VERL: dict[str, str] = {
    "algorithm.group_size": "actor_rollout_ref.rollout.n (recipe key grpo.n)",
    "algorithm.kl_coef": (
        "actor_rollout_ref.actor.kl_loss_coef with actor_rollout_ref.actor.use_kl_loss=True "
        "(recipe keys grpo.kl_coef and grpo.kl_loss), or algorithm.kl_ctrl.kl_coef with "
        "algorithm.use_kl_in_reward=True"
    ),
    "algorithm.adv_norm": "algorithm.norm_adv_by_std_in_grpo (recipe key grpo.norm_adv_by_std)",
    "algorithm.clip_rewards": "nothing in verl: clip inside a custom reward function (custom_reward_function.path)",
    "algorithm.reward_clip_range": "nothing in verl: clip inside a custom reward function (custom_reward_function.path)",
    "algorithm.baseline_smoothing_alpha": "nothing in verl: GRPO's baseline is the group mean",
    "actor_rollout_ref.actor.grad_accumulation_steps": (
        "nothing: verl derives it from ppo_mini_batch_size / ppo_micro_batch_size_per_gpu "
        "(recipe keys batch.mini and batch.micro_per_gpu)"
    ),
    "actor_rollout_ref.actor.seqlen_balancing": (
        "trainer.balance_batch=True with actor_rollout_ref.actor.use_dynamic_bsz=True (recipe key batch.dynamic_bsz)"
    ),
    "actor_rollout_ref.actor.attention_config": (
        "actor_rollout_ref.model.override_config.attn_implementation (FSDP) or "
        "actor_rollout_ref.actor.megatron.override_transformer_config.attention_backend (Megatron)"
    ),
    "actor_rollout_ref.actor.max_sequence_length": (
        "data.max_prompt_length + data.max_response_length (recipe keys data.max_prompt_length, data.max_response_length)"
    ),
    "actor_rollout_ref.actor.micro_batch_size": (
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu (recipe key batch.micro_per_gpu)"
    ),
    "actor_rollout_ref.actor.model_name_or_path": "actor_rollout_ref.model.path (recipe key model.path)",
    "actor_rollout_ref.actor.megatron.grad_offload": (
        f"removed in verl {VERL_VERSION}: use actor_rollout_ref.actor.megatron.param_offload and .optimizer_offload "
        "(recipe keys offload.param and offload.optimizer)"
    ),
    "actor_rollout_ref.actor.megatron.data_loader_type": "data.dataloader_num_workers (there is no loader type)",
    "actor_rollout_ref.actor.megatron.num_workers": "data.dataloader_num_workers",
    "actor_rollout_ref.actor.megatron.override_transformer_config.fp16": (
        "actor_rollout_ref.actor.megatron.dtype=float16 (recipe key model.dtype=float16)"
    ),
    "actor_rollout_ref.actor.megatron.override_transformer_config.fp16_lm_cross_entropy": (
        "nothing to set: follows actor_rollout_ref.actor.megatron.dtype (recipe key model.dtype)"
    ),
    "config": "--config-name (hpc-grpo chooses ppo_trainer or ppo_megatron_trainer from recipe key backend)",
    "output_dir": "trainer.default_local_dir (hpc-grpo sets it inside the run directory)",
    "num_train_steps": "trainer.total_training_steps (recipe key train.total_training_steps)",
    "log_interval": "nothing: verl logs every step (trainer.logger)",
    "save_interval": "trainer.save_freq (recipe key checkpoint.save_freq)",
}

# Megatron's optimizer settings (megatron-core's OptimizerConfig fields) go under the actor's optim section: the pinned verl
# copies it into OptimizerConfig (verl/utils/megatron/optimizer.py). Its McoreEngineConfig (the `megatron` section) has
# no override_optimizer_config field, so a key typed there stops main_ppo while it builds the actor's config.
OPTIMIZER_OVERRIDE = "actor_rollout_ref.actor.optim.override_optimizer_config"
OPTIMIZER_OFFLOAD_KNOBS = ("optimizer_cpu_offload", "optimizer_offload_fraction", "overlap_cpu_optimizer_d2h_h2d",
                           "use_precision_aware_optimizer")
NOT_IN_VERL.update({
    f"actor_rollout_ref.{role}.megatron.override_optimizer_config.{knob}": (
        f"+{OPTIMIZER_OVERRIDE}.{knob} (verl {VERL_VERSION} reads megatron-core's optimizer settings from the actor's optim "
        "section; its megatron section has no override_optimizer_config)"
    )
    for role in ("actor", "ref") for knob in OPTIMIZER_OFFLOAD_KNOBS
})

KEY_RE = re.compile(r"^(\+\+|\+|~)?[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z0-9_]+)*\Z")


def bare_key(key: str) -> str:
    """`++a.b` / `+a.b` / `~a.b` / `--a.b` -> `a.b`."""
    return key.lstrip("+~-")


def real_key_for(key: str) -> str | None:
    """The real verl key for a field-report flag, trying the short forms users paste."""
    bare = bare_key(key)
    for candidate in (bare, f"actor_rollout_ref.{bare}", f"actor_rollout_ref.actor.{bare}"):
        if candidate in NOT_IN_VERL:
            return NOT_IN_VERL[candidate]
    return None


def real_fix(real: str) -> str:
    """The fix line for a NOT_IN_VERL entry: "use X", or the entry itself when it says there is nothing to use."""
    return real if real.startswith(("removed", "nothing")) else f"use {real}"


@dataclass(frozen=True)
class KeyRoutes:
    """How config.resolve treats verl keys for one spec (engines.verl_keymap derives it from the modelled keys):
    `translate` maps a verl key to the recipe key it is a plain copy of; `owned` holds the rendered value of every
    other key hpc-grpo sets, so a passthrough key equal to it is dropped as redundant (a different value is left
    for the engine's check to refuse, naming the setting that decides it)."""

    translate: dict[str, str] = field(default_factory=dict)
    owned: dict[str, str] = field(default_factory=dict)


def is_engine_key(key: str) -> bool:
    """Keys routed to passthrough: `+`/`++`-prefixed or under one of verl's sections."""
    bare = bare_key(key)
    return key.startswith(("+", "~")) or bare.split(".", 1)[0] in VERL_SECTIONS


def format_value(value: object) -> str:
    """A Python value as a Hydra override value (the whole override is shell-quoted later)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "True" if value else "False"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(format_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ",".join(f"{k}:{format_value(v)}" for k, v in value.items()) + "}"
    text = str(value)
    if re.fullmatch(r"[A-Za-z_/][A-Za-z0-9_./:@-]*", text) and text.lower() not in (
        "true",
        "false",
        "null",
        "none",
    ):
        return text
    escaped = text.replace("\\", "\\\\").replace("'", "\\'")
    return f"'{escaped}'"
