"""verl adapter: RunSpec -> the exact `python -m verl.trainer.main_ppo` call.

Every override carries the recipe field it came from, so a passthrough key that would fight a
modelled field is refused with the field to set instead (one source of truth per setting).
"""

from __future__ import annotations

from pathlib import Path

from hpc_grpo import checkpoints, runs
from hpc_grpo.engines import EngineCommand, Override
from hpc_grpo.engines.verl_keys import KEY_RE, bare_key, format_value, real_key_for
from hpc_grpo.findings import Finding, error
from hpc_grpo.spec import RunSpec

ENTRY = ["python3", "-m", "verl.trainer.main_ppo"]


def checkpoint_dir(spec: RunSpec) -> Path:
    """Absolute: verl's default is relative to the working directory, which differs per node. Listing
    and judging the folders in it is hpc_grpo.checkpoints' job."""
    return checkpoints.checkpoint_dir(spec.path)


def config_name(spec: RunSpec) -> str:
    return "ppo_megatron_trainer" if spec.recipe.backend == "megatron" else "ppo_trainer"


def modelled_overrides(spec: RunSpec) -> list[Override]:
    """The overrides hpc-grpo derives from recipe fields, in a stable order (golden files pin it)."""
    r = spec.recipe
    arr = "actor_rollout_ref"
    out: list[Override] = []

    def add(key: str, value: object, source: str) -> None:
        out.append(Override(key, value, source))

    add("algorithm.adv_estimator", "grpo", "engine")
    add("algorithm.norm_adv_by_std_in_grpo", r.grpo.norm_adv_by_std, "grpo.norm_adv_by_std")
    add("algorithm.use_kl_in_reward", False, "grpo.kl_loss")
    add("data.train_files", r.data.train_files, "data.train_files")
    add("data.val_files", r.data.val_files, "data.val_files")
    add("data.train_batch_size", r.batch.train, "batch.train")
    add("data.max_prompt_length", r.data.max_prompt_length, "data.max_prompt_length")
    add("data.max_response_length", r.data.max_response_length, "data.max_response_length")
    add("data.filter_overlong_prompts", r.data.filter_overlong_prompts, "data.filter_overlong_prompts")
    add("data.truncation", r.data.truncation, "data.truncation")
    add("data.shuffle", r.data.shuffle, "data.shuffle")
    add(f"{arr}.model.path", r.model.path, "model.path")
    add(f"{arr}.model.enable_gradient_checkpointing", r.model.gradient_checkpointing, "model.gradient_checkpointing")
    add(f"{arr}.model.use_remove_padding", r.model.use_remove_padding, "model.use_remove_padding")
    add(f"{arr}.model.trust_remote_code", r.model.trust_remote_code, "model.trust_remote_code")
    add(f"{arr}.actor.optim.lr", r.grpo.lr, "grpo.lr")
    add(f"{arr}.actor.ppo_mini_batch_size", r.batch.mini, "batch.mini")
    add(f"{arr}.actor.use_dynamic_bsz", r.batch.dynamic_bsz, "batch.dynamic_bsz")
    if r.batch.dynamic_bsz:
        max_tok = r.batch.max_token_len_per_gpu or (r.data.max_prompt_length + r.data.max_response_length)
        add(f"{arr}.actor.ppo_max_token_len_per_gpu", max_tok, "batch.max_token_len_per_gpu")
        add(f"{arr}.rollout.log_prob_use_dynamic_bsz", True, "batch.dynamic_bsz")
        add(f"{arr}.ref.log_prob_use_dynamic_bsz", True, "batch.dynamic_bsz")
        add("trainer.balance_batch", True, "batch.dynamic_bsz")
    if r.batch.micro_per_gpu is not None:
        add(f"{arr}.actor.ppo_micro_batch_size_per_gpu", r.batch.micro_per_gpu, "batch.micro_per_gpu")
    if r.batch.log_prob_micro_per_gpu is not None:
        add(f"{arr}.rollout.log_prob_micro_batch_size_per_gpu", r.batch.log_prob_micro_per_gpu, "batch.log_prob_micro_per_gpu")
        add(f"{arr}.ref.log_prob_micro_batch_size_per_gpu", r.batch.log_prob_micro_per_gpu, "batch.log_prob_micro_per_gpu")
    add(f"{arr}.actor.use_kl_loss", r.grpo.kl_loss, "grpo.kl_loss")
    add(f"{arr}.actor.kl_loss_coef", r.grpo.kl_coef, "grpo.kl_coef")
    add(f"{arr}.actor.kl_loss_type", r.grpo.kl_loss_type, "grpo.kl_loss_type")
    add(f"{arr}.actor.entropy_coeff", r.grpo.entropy_coeff, "grpo.entropy_coeff")
    add(f"{arr}.rollout.name", r.rollout.name, "rollout.name")
    add(f"{arr}.rollout.n", r.grpo.n, "grpo.n")
    add(f"{arr}.rollout.temperature", r.grpo.temperature, "grpo.temperature")
    add(f"{arr}.rollout.tensor_model_parallel_size", r.parallel.rollout_tp, "parallel.rollout_tp")
    add(f"{arr}.rollout.gpu_memory_utilization", r.rollout.gpu_memory_utilization, "rollout.gpu_memory_utilization")
    if r.rollout.load_format or (r.lora.rank and r.backend == "fsdp"):
        add(f"{arr}.rollout.load_format", r.rollout.load_format or "safetensors", "rollout.load_format")
    if r.rollout.layered_summon:
        add(f"{arr}.rollout.layered_summon", True, "rollout.layered_summon")

    if r.backend == "fsdp":
        add(f"{arr}.actor.fsdp_config.param_offload", r.offload.param, "offload.param")
        add(f"{arr}.actor.fsdp_config.optimizer_offload", r.offload.optimizer, "offload.optimizer")
        add(f"{arr}.ref.fsdp_config.param_offload", r.offload.ref_param, "offload.ref_param")
        if r.lora.rank:
            add(f"{arr}.model.lora_rank", r.lora.rank, "lora.rank")
            add(f"{arr}.model.lora_alpha", r.lora.alpha, "lora.alpha")
            add(f"{arr}.model.target_modules", r.lora.target_modules, "lora.target_modules")
    else:
        p = r.parallel
        for role in ("actor", "ref"):
            mg = f"{arr}.{role}.megatron"
            add(f"{mg}.tensor_model_parallel_size", p.tp, "parallel.tp")
            add(f"{mg}.pipeline_model_parallel_size", p.pp, "parallel.pp")
            add(f"{mg}.context_parallel_size", p.cp, "parallel.cp")
            add(f"{mg}.expert_model_parallel_size", p.ep, "parallel.ep")
            if p.etp is not None:
                add(f"{mg}.expert_tensor_parallel_size", p.etp, "parallel.etp")
            if p.vpp is not None:
                add(f"{mg}.virtual_pipeline_model_parallel_size", p.vpp, "parallel.vpp")
            add(f"{mg}.sequence_parallel", p.sequence_parallel, "parallel.sequence_parallel")
            add(f"{mg}.dtype", r.model.dtype, "model.dtype")
        add(f"{arr}.actor.megatron.param_offload", r.offload.param, "offload.param")
        add(f"{arr}.actor.megatron.optimizer_offload", r.offload.optimizer, "offload.optimizer")
        add(f"{arr}.ref.megatron.param_offload", r.offload.ref_param, "offload.ref_param")
        if r.lora.rank:
            lora = f"{arr}.model.lora"
            add(f"{lora}.rank", r.lora.rank, "lora.rank")
            add(f"{lora}.alpha", r.lora.alpha, "lora.alpha")
            add(f"{lora}.dropout", r.lora.dropout, "lora.dropout")
            if isinstance(r.lora.target_modules, list):
                add(f"{lora}.target_modules", r.lora.target_modules, "lora.target_modules")

    t = r.train
    add("trainer.critic_warmup", 0, "engine")
    add("trainer.nnodes", r.resources.nodes, "resources.nodes")
    add("trainer.n_gpus_per_node", spec.gpus_per_node, "resources.gpus_per_node")
    add("trainer.total_epochs", t.total_epochs, "train.total_epochs")
    if t.total_training_steps is not None:
        add("trainer.total_training_steps", t.total_training_steps, "train.total_training_steps")
    add("trainer.test_freq", t.test_freq, "train.test_freq")
    add("trainer.val_before_train", t.val_before_train, "train.val_before_train")
    add("trainer.save_freq", r.checkpoint.save_freq, "checkpoint.save_freq")
    add("trainer.max_actor_ckpt_to_keep", r.checkpoint.keep, "checkpoint.keep")
    add("trainer.default_local_dir", str(checkpoint_dir(spec)), "run directory")
    add("trainer.logger", list(r.logging.logger), "logging.logger")
    add("trainer.project_name", r.logging.project, "logging.project")
    add("trainer.experiment_name", r.logging.experiment or spec.run_name, "logging.experiment")
    cpus = spec.cluster.cpus_per_node if r.resources.cpus_per_task is None else r.resources.cpus_per_task
    add("ray_kwargs.ray_init.num_cpus", cpus, "resources.cpus_per_task")
    env = "+ray_kwargs.ray_init.runtime_env.env_vars"
    add(f"{env}.WANDB_RUN_ID", runs.wandb_run_id(spec.path), "run directory")
    add(f"{env}.WANDB_RESUME", "allow", "engine")
    return out


# Set at every job start by hpc_grpo.job.prepare_resume, never rendered: verl's `auto` crashes on an empty
# tracker and silently restarts from step 0 on a missing one, so the job names the checkpoint itself.
RESUME_KEYS = ("trainer.resume_mode", "trainer.resume_from_path")
RESUME_SOURCE = "resume preparation at job start (hpc-grpo resume)"


def resume_overrides(step_folder: Path | None) -> list[str]:
    """The overrides that point verl at one global_step_N folder, or start it fresh (never `auto`)."""
    if step_folder is None:
        return ["trainer.resume_mode=disable"]
    if not Path(step_folder).name.startswith("global_step_"):
        raise ValueError(f"{step_folder} is not a global_step_N folder (verl's resume_path needs one)")
    return ["trainer.resume_mode=resume_path", f"trainer.resume_from_path={format_value(str(step_folder))}"]


class VerlEngine:
    name = "verl"
    launch_template = "verl_ray_launch.sh.j2"

    def command(self, spec: RunSpec) -> EngineCommand:
        overrides = [f"{o.key}={format_value(o.value)}" for o in modelled_overrides(spec)]
        overrides += [f"{k}={format_value(v)}" for k, v in spec.recipe.passthrough.items()]
        name = config_name(spec)
        return EngineCommand(
            argv=[*ENTRY, "--config-name", name, *overrides],
            config_name=name,
            overrides=overrides,
            env={"WANDB_RUN_ID": runs.wandb_run_id(spec.path), "WANDB_RESUME": "allow"},
        )

    def check(self, spec: RunSpec) -> list[Finding]:
        """Passthrough keys: well-formed, real verl keys, and not fighting a modelled field."""
        findings: list[Finding] = []
        g = spec.recipe.grpo
        if g.reward != "gsm8k_strict" or g.format_score:
            findings.append(error("grpo.reward", "verl's built-in GSM8K reward is the strict scorer with format score 0",
                                  "use grpo.reward=gsm8k_strict grpo.format_score=0, or a custom reward function "
                                  "(passthrough custom_reward_function.path=...)"))
        owned = {o.key: o.source for o in modelled_overrides(spec)} | dict.fromkeys(RESUME_KEYS, RESUME_SOURCE)
        for key in spec.recipe.passthrough:
            pkey = f"passthrough.{key}"
            real = real_key_for(key)
            if real is not None:
                findings.append(error(pkey, f"'{bare_key(key)}' does not exist in verl.", f"use {real}"))
            elif not KEY_RE.match(key):
                findings.append(error(pkey, "is not a valid Hydra key", "use dotted names of letters, digits and '_'"))
            elif bare_key(key) in owned:
                src = owned[bare_key(key)]
                findings.append(
                    error(pkey, f"is set by hpc-grpo from recipe key '{src}'", f"set {src} instead")
                )
        return findings
