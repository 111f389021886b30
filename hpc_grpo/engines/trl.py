"""trl adapter: RunSpec -> GRPOConfig/LoraConfig keyword arguments and the job command.

Light on purpose: `hpc-grpo plan` imports this module, so nothing here imports torch, transformers
or trl. The field list of trl's GRPOConfig is kept as a static tuple (a unit test compares it with
the installed trl), so `plan` can reject a misspelt passthrough key on the login node.

Step semantics follow verl: one training step = `batch.train` prompts x `grpo.n` completions
generated, then `batch.train / batch.mini` optimizer updates. trl counts optimizer updates, so when
train > mini its step numbers (and checkpoint-N names) are `train / mini` times the recipe's.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hpc_grpo.runstate import layout, runs
from hpc_grpo.engines.base import EngineCommand, JobImports, Override
from hpc_grpo.common.findings import Finding, error, info, warning
from hpc_grpo.config.engine_traits import TRL
from hpc_grpo.config.spec import RunSpec
from hpc_grpo.runstate.checkpoints import Checkpoint

ENTRY = ["-m", "hpc_grpo.job.trl_job"]  # after the job's interpreter (spec.python)

# dataclasses.fields(trl.GRPOConfig) of trl 1.16.0 on transformers 5.24 (GRPOConfig inherits
# TrainingArguments, so both versions shape it). Regenerate when either is upgraded:
#   python -c "import dataclasses, trl; print([f.name for f in dataclasses.fields(trl.GRPOConfig)])"
# tests/unit/test_trl_engine.py fails when this drifts from the installed trl.
TRL_VERSION = "1.16.0"
GRPO_CONFIG_FIELDS: tuple[str, ...] = (
    'output_dir', 'per_device_train_batch_size', 'num_train_epochs', 'max_steps', 'learning_rate',
    'lr_scheduler_type', 'lr_scheduler_kwargs', 'warmup_steps', 'optim', 'optim_args', 'weight_decay',
    'adam_beta1', 'adam_beta2', 'adam_epsilon', 'optim_target_modules', 'gradient_accumulation_steps',
    'average_tokens_across_devices', 'max_grad_norm', 'label_smoothing_factor', 'bf16', 'fp16',
    'bf16_full_eval', 'fp16_full_eval', 'tf32', 'activation_checkpointing', 'activation_checkpointing_kwargs',
    'gradient_checkpointing', 'gradient_checkpointing_kwargs', 'torch_compile', 'torch_compile_backend',
    'torch_compile_mode', 'use_liger_kernel', 'liger_kernel_config', 'use_cache', 'neftune_noise_alpha',
    'torch_empty_cache_steps', 'auto_find_batch_size', 'logging_strategy', 'logging_steps',
    'logging_first_step', 'log_on_each_node', 'logging_nan_inf_filter', 'include_num_input_tokens_seen',
    'log_level', 'log_level_replica', 'disable_tqdm', 'report_to', 'run_name', 'project', 'trackio_space_id',
    'trackio_bucket_id', 'trackio_static_space_id', 'eval_strategy', 'eval_steps', 'eval_delay',
    'per_device_eval_batch_size', 'prediction_loss_only', 'eval_on_start', 'eval_do_concat_batches',
    'eval_use_gather_object', 'eval_accumulation_steps', 'include_for_metrics', 'batch_eval_metrics',
    'save_only_model', 'save_strategy', 'save_steps', 'save_on_each_node', 'save_total_limit',
    'enable_jit_checkpoint', 'push_to_hub', 'hub_token', 'hub_private_repo', 'hub_model_id', 'hub_strategy',
    'hub_always_push', 'hub_revision', 'load_best_model_at_end', 'metric_for_best_model', 'greater_is_better',
    'ignore_data_skip', 'restore_callback_states_from_checkpoint', 'full_determinism', 'seed', 'data_seed',
    'use_cpu', 'accelerator_config', 'parallelism_config', 'dataloader_drop_last', 'dataloader_num_workers',
    'dataloader_pin_memory', 'dataloader_persistent_workers', 'dataloader_prefetch_factor',
    'dataloader_multiprocessing_context', 'dataloader_in_order', 'remove_unused_columns', 'label_names',
    'train_sampling_strategy', 'length_column_name', 'ddp_find_unused_parameters', 'ddp_bucket_cap_mb',
    'ddp_broadcast_buffers', 'ddp_static_graph', 'ddp_backend', 'ddp_timeout', 'fsdp', 'fsdp_config',
    'deepspeed', 'debug', 'skip_memory_metrics', 'do_train', 'do_eval', 'do_predict', 'resume_from_checkpoint',
    'local_rank', 'model_init_kwargs', 'trust_remote_code', 'router_aux_loss_coef', 'disable_dropout',
    'cast_lm_head_to_fp32', 'num_generations', 'num_generations_eval', 'max_completion_length',
    'ds3_gather_for_generation', 'shuffle_dataset', 'pad_to_multiple_of', 'generation_batch_size',
    'steps_per_generation', 'temperature', 'top_p', 'top_k', 'min_p', 'generation_kwargs',
    'chat_template_kwargs', 'repetition_penalty', 'cache_implementation', 'use_vllm', 'vllm_mode',
    'vllm_model_impl', 'vllm_enable_sleep_mode', 'vllm_structured_outputs_regex', 'vllm_server_base_url',
    'vllm_server_host', 'vllm_server_port', 'vllm_server_timeout', 'vllm_group_port',
    'vllm_gpu_memory_utilization', 'vllm_max_model_length', 'vllm_tensor_parallel_size', 'beta',
    'num_iterations', 'epsilon', 'delta', 'epsilon_high', 'sapo_temperature_neg', 'sapo_temperature_pos',
    'vespo_k_pos', 'vespo_lambda_pos', 'vespo_k_neg', 'vespo_lambda_neg', 'importance_sampling_level',
    'reward_weights', 'multi_objective_aggregation', 'scale_rewards', 'loss_type', 'mask_truncated_completions',
    'sync_ref_model', 'ref_model_mixup_alpha', 'ref_model_sync_steps', 'top_entropy_quantile', 'entropy_coef',
    'use_adaptive_entropy', 'entropy_coef_min', 'entropy_coef_max', 'entropy_coef_delta', 'entropy_target',
    'max_tool_calling_iterations', 'vllm_importance_sampling_correction', 'vllm_importance_sampling_mode',
    'vllm_importance_sampling_clip_max', 'vllm_importance_sampling_clip_min', 'off_policy_mask_threshold',
    'use_bias_correction_kl', 'log_completions', 'log_multimodal', 'num_completions_to_print',
    'log_unique_prompts', 'log_completions_hub_repo', 'use_transformers_continuous_batching',
    'transformers_continuous_batching_config', 'use_transformers_paged', 'vllm_importance_sampling_cap'
)

# Passthrough keys that would break the run's contract with its directory (resume comes from disk,
# nothing is pushed anywhere, no secret in a spec).
FORBIDDEN_PASSTHROUGH: dict[str, str] = {
    "resume_from_checkpoint": "the job resumes from the newest complete checkpoint itself",
    "push_to_hub": "runs stay in the run directory; export after training instead",
    "hub_token": "secrets never go into a spec; and runs are not pushed to the Hub",
    "hub_model_id": "runs are not pushed to the Hub",
    "hub_strategy": "runs are not pushed to the Hub",
    "hub_always_push": "runs are not pushed to the Hub",
    "log_completions_hub_repo": "runs are not pushed to the Hub",
    "auto_find_batch_size": "trl rejects it for GRPO; set batch.micro_per_gpu instead",
}

TRAIN_SUFFIXES = (".jsonl", ".json", ".parquet")


@dataclass(frozen=True, slots=True)
class BatchLayout:
    """How the recipe's prompt batches map onto trl's completion batches (one process)."""

    per_device: int  # completions per forward/backward pass (per_device_train_batch_size)
    grad_accum: int  # passes per optimizer update
    generation_batch: int  # completions generated at once: batch.train x grpo.n
    updates_per_step: int  # optimizer updates per generation: batch.train / batch.mini


def batch_layout(spec: RunSpec) -> BatchLayout:
    """verl's batch semantics in trl's terms; non-dividing values are rounded down here and
    reported by `check` (and plan's batch checks) before anything is submitted."""
    b, n = spec.recipe.batch, spec.recipe.grpo.n
    update = b.mini * n
    per_device = b.micro_per_gpu or update
    return BatchLayout(
        per_device=per_device,
        grad_accum=max(1, update // per_device),
        generation_batch=b.train * n,
        updates_per_step=max(1, b.train // b.mini),
    )


def _owned(spec: RunSpec, use_cpu: bool) -> list[Override]:
    """GRPOConfig fields hpc-grpo sets from recipe fields or the run layout, with their source."""
    r = spec.recipe
    lay = batch_layout(spec)
    out: list[Override] = []

    def add(key: str, value: object, source: str) -> None:
        out.append(Override(key, value, source))

    # absolute, inside the run directory: a requeued job on another node finds it there
    add("output_dir", str(layout.checkpoints_dir(spec.path)), "run directory")
    add("run_name", spec.run_name, "run name")
    add("seed", r.train.seed, "train.seed")
    add("num_generations", r.grpo.n, "grpo.n")
    # trl 1.16's GRPOConfig has no max_prompt_length: the job filters overlong prompts itself.
    add("max_completion_length", r.data.max_response_length, "data.max_response_length")
    add("temperature", r.grpo.temperature, "grpo.temperature")
    add("learning_rate", r.grpo.lr, "grpo.lr")
    add("beta", r.grpo.kl_coef if r.grpo.kl_loss else 0.0, "grpo.kl_coef")
    add("entropy_coef", r.grpo.entropy_coeff, "grpo.entropy_coeff")
    add("scale_rewards", "group" if r.grpo.norm_adv_by_std else "none", "grpo.norm_adv_by_std")
    add("per_device_train_batch_size", lay.per_device, "batch.micro_per_gpu")
    add("gradient_accumulation_steps", lay.grad_accum, "batch.mini")
    add("generation_batch_size", lay.generation_batch, "batch.train")
    add("shuffle_dataset", r.data.shuffle, "data.shuffle")
    add("activation_checkpointing", r.model.gradient_checkpointing, "model.gradient_checkpointing")
    add("trust_remote_code", r.model.trust_remote_code, "model.trust_remote_code")
    steps = r.train.total_training_steps
    add("max_steps", steps * lay.updates_per_step if steps else -1, "train.total_training_steps")
    add("num_train_epochs", r.train.total_epochs, "train.total_epochs")
    add("save_strategy", "steps", "checkpoint.save_freq")
    add("save_steps", r.checkpoint.save_freq * lay.updates_per_step, "checkpoint.save_freq")
    add("save_total_limit", None, "engine: hpc-grpo prunes (checkpoint.keep_last and friends)")
    add("save_only_model", False, "engine: resume needs optimizer, scheduler and RNG state")
    add("logging_steps", 1, f"engine: {layout.METRICS_FILE} has one line per step")
    reporters = [x for x in r.logging.logger if x in ("wandb", "tensorboard")]
    add("report_to", reporters or "none", "logging.logger")
    add("use_cpu", use_cpu, "engine: no GPU visible")
    add("bf16", (not use_cpu) and r.model.dtype == "bfloat16", "model.dtype")
    add("fp16", (not use_cpu) and r.model.dtype == "float16", "model.dtype")
    add("use_vllm", r.rollout.name == "vllm", "rollout.name")
    stop = r.train.early_stop
    if stop is not None and r.train.test_freq > 0:
        # validation for early stopping: trl's evaluate generates grpo.n completions per validation prompt
        add("eval_strategy", "steps", "train.early_stop")
        add("eval_steps", r.train.test_freq * lay.updates_per_step, "train.test_freq")
        add("per_device_eval_batch_size", r.grpo.n * max(1, lay.per_device // r.grpo.n), "grpo.n")
    if r.rollout.name == "vllm":
        add("vllm_gpu_memory_utilization", r.rollout.gpu_memory_utilization, "rollout.gpu_memory_utilization")
        add("vllm_tensor_parallel_size", r.parallel.rollout_tp, "parallel.rollout_tp")
    return out


def _defaults(spec: RunSpec) -> dict[str, Any]:
    """Engine choices a passthrough key may change: verl's defaults where trl's differ."""
    out: dict[str, Any] = {
        "lr_scheduler_type": "constant",  # verl's actor optimizer default; trl's is linear decay
        "disable_tqdm": True,  # progress bars garble Slurm logs; the job prints one line per step
    }
    if spec.recipe.rollout.name == "vllm":
        out["vllm_mode"] = "colocate"  # the job is one process: no separate `trl vllm-serve`
    return out


def grpo_config_kwargs(spec: RunSpec, use_cpu: bool | None = None) -> dict[str, Any]:
    """Keyword arguments for trl.GRPOConfig; the passthrough block is applied last.

    use_cpu: the job passes `not torch.cuda.is_available()`; None means "no GPUs in the spec".
    """
    if use_cpu is None:
        use_cpu = spec.gpus_per_node == 0
    kwargs: dict[str, Any] = {o.key: o.value for o in _owned(spec, use_cpu)}
    kwargs.update(_defaults(spec))
    kwargs.update(spec.recipe.passthrough)
    return kwargs


def lora_config_kwargs(spec: RunSpec) -> dict[str, Any] | None:
    """Keyword arguments for peft.LoraConfig, or None for full fine-tuning (lora.rank 0)."""
    lora = spec.recipe.lora
    if not lora.rank:
        return None
    target = lora.target_modules if isinstance(lora.target_modules, str) else list(lora.target_modules)
    return {
        "r": lora.rank,
        "lora_alpha": lora.alpha,
        "lora_dropout": lora.dropout,
        "target_modules": target,
        "task_type": "CAUSAL_LM",
    }


class TrlEngine:
    name = TRL.name
    launch_template = "trl_launch.sh.j2"
    traits = TRL

    def resume_overrides(self, step_folder: Path | None) -> list[str]:
        """None: the job passes the checkpoint to trainer.train(resume_from_checkpoint=...) itself."""
        return []

    def checkpoint_world_size(self, ckpt: Checkpoint) -> int | None:
        """trl saves whole weights: any world size loads them."""
        return None

    def lora_targets_unchecked(self, spec: RunSpec) -> str:
        return ""

    def command(self, spec: RunSpec) -> EngineCommand:
        return EngineCommand(
            argv=[spec.python, *ENTRY, "--spec", str(layout.spec_file(spec.path))],
            env={"WANDB_RUN_ID": runs.wandb_run_id(spec.path), "WANDB_RESUME": "allow"},
        )

    def job_imports(self, spec: RunSpec) -> JobImports:
        """Not tried before queueing yet: trl's job runs the submitting interpreter by default, which has trl
        wherever hpc-grpo[local] is installed (the quickstart's .venv)."""
        return JobImports()

    def check(self, spec: RunSpec) -> list[Finding]:
        """What trl cannot do with this recipe, its batch layout included (verl's batch rules, engines.verl_checks,
        skip trl). nodes > 1 is refused by plan's resource check (planning.resources), not repeated here."""
        return [
            *_check_backend(spec),
            *_check_rollout(spec),
            *_check_batches(spec),
            *_check_data(spec),
            *_check_algorithm(spec),
            *_check_passthrough(spec),
        ]


def _check_backend(spec: RunSpec) -> list[Finding]:
    r = spec.recipe
    out: list[Finding] = []
    if r.backend != "fsdp":
        out.append(error("backend", f"the trl engine has no {r.backend} backend", "use backend=fsdp, or engine verl"))
    if spec.gpus_per_node > 1:
        out.append(warning("resources.gpus_per_node", f"the trl job is one process and uses 1 of {spec.gpus_per_node} GPUs",
                           "use resources.gpus_per_node=1, or engine verl for multi-GPU runs"))
    p = r.parallel
    ignored = [f"parallel.{k}={v}" for k, v in (("tp", p.tp), ("pp", p.pp), ("cp", p.cp), ("ep", p.ep)) if v != 1]
    if p.sequence_parallel:
        ignored.append("parallel.sequence_parallel=true")
    if ignored:
        out.append(warning("parallel", f"the trl engine ignores {', '.join(ignored)}", "drop them, or use engine verl"))
    return out


def _check_rollout(spec: RunSpec) -> list[Finding]:
    name = spec.recipe.rollout.name
    if name == "hf":
        return []
    if name == "vllm":
        if spec.gpus_per_node == 0:
            return [error("rollout.name", "vllm rollouts need a GPU and this job gets none", "use rollout.name=hf on CPU")]
        return [warning("rollout.name", "vllm rollouts need a GPU node with vllm installed (colocated in the job)",
                        "pip install the train-verl extra on the GPU cluster, or use rollout.name=hf")]
    return [error("rollout.name", f"trl has no {name} rollout", "use rollout.name=hf (CPU or GPU) or vllm (GPU)")]


def _check_batches(spec: RunSpec) -> list[Finding]:
    b, n = spec.recipe.batch, spec.recipe.grpo.n
    out: list[Finding] = []
    if b.train % b.mini:
        out.append(error("batch.mini", f"batch.train {b.train} is not a multiple of batch.mini {b.mini}: each step "
                         "splits its generated batch into whole optimizer updates", "choose batch.mini dividing batch.train"))
    if b.micro_per_gpu is None:
        out.append(warning("batch.micro_per_gpu", f"not set: each update runs as one pass of {b.mini * n} completions",
                           "set batch.micro_per_gpu to bound memory"))
    elif (b.mini * n) % b.micro_per_gpu:
        out.append(error("batch.micro_per_gpu", f"an update holds batch.mini x grpo.n = {b.mini}x{n} = {b.mini * n} "
                         f"completions, not a multiple of micro batch {b.micro_per_gpu}",
                         "choose batch.micro_per_gpu dividing batch.mini x grpo.n"))
    if b.dynamic_bsz:
        out.append(warning("batch.dynamic_bsz", "the trl engine has no dynamic batch size; it is ignored",
                           "set batch.dynamic_bsz=false"))
    return out


def _check_data(spec: RunSpec) -> list[Finding]:
    d, t = spec.recipe.data, spec.recipe.train
    out: list[Finding] = []
    if isinstance(d.train_files, list) and len(d.train_files) > 1:
        out.append(error("data.train_files", f"a list of {len(d.train_files)} files: the trl engine trains on one file",
                         "merge them into one .jsonl (or .parquet) and set data.train_files to it, or use engine=verl, "
                         "which concatenates a list"))
    elif not d.train_list[0].endswith(TRAIN_SUFFIXES):
        out.append(error("data.train_files", f"{d.train_list[0]!r} is not a .jsonl, .json or .parquet file",
                         "prepare the data with `hpc-grpo data gsm8k` (or `hpc-grpo data codegen`) and use its trl/train.jsonl"))
    if not d.filter_overlong_prompts and d.truncation != "error":
        out.append(warning("data.truncation", f"trl cannot truncate chat prompts ('{d.truncation}'): prompts longer "
                           f"than data.max_prompt_length={d.max_prompt_length} are kept whole",
                           "set data.filter_overlong_prompts=true to drop them"))
    if t.early_stop is not None and t.test_freq <= 0:
        out.append(error("train.test_freq", f"train.early_stop needs validations, and train.test_freq={t.test_freq} "
                         "asks for none", "set train.test_freq to validate every N steps (e.g. 5)"))
    if t.early_stop is None and (t.test_freq > 0 or t.val_before_train):
        out.append(warning("train.test_freq", "the trl job validates during training only for train.early_stop "
                           "(GSM8K eval runs after it)", "set train.test_freq=-1 and train.val_before_train=false, "
                           "or set train.early_stop"))
    if t.early_stop is not None and t.val_before_train:
        out.append(warning("train.val_before_train", "the trl job validates every train.test_freq steps, not before "
                           "the first", "set train.val_before_train=false"))
    return out


def _check_algorithm(spec: RunSpec) -> list[Finding]:
    g = spec.recipe.grpo
    out: list[Finding] = []
    if g.kl_in_reward:
        out.append(error("grpo.kl_in_reward", "true: trl's GRPO has its KL term in the loss only (beta), not in the "
                         "reward", "set grpo.kl_in_reward=false (grpo.kl_loss=true with grpo.kl_coef is trl's KL), "
                         "or use engine=verl"))
    if g.kl_loss and g.kl_coef > 0 and g.kl_loss_type != "low_var_kl":
        out.append(warning("grpo.kl_loss_type", f"trl always uses the k3 estimator (verl's low_var_kl), not {g.kl_loss_type}",
                           "set grpo.kl_loss_type=low_var_kl"))
    b = spec.recipe.batch
    if b.micro_per_gpu and b.micro_per_gpu % g.n:
        out.append(info("batch.micro_per_gpu", f"micro batch {b.micro_per_gpu} splits groups of {g.n}; trl 1.16 "
                        "normalises advantages over the whole generation batch, so this is allowed", ""))
    return out


def _check_passthrough(spec: RunSpec) -> list[Finding]:
    """Passthrough keys are GRPOConfig field names, and none fights a recipe field."""
    out: list[Finding] = []
    owned = {o.key: o.source for o in _owned(spec, spec.gpus_per_node == 0)}
    for key in spec.recipe.passthrough:
        pkey = f"passthrough.{key}"
        if key in FORBIDDEN_PASSTHROUGH:
            out.append(error(pkey, "is not allowed", FORBIDDEN_PASSTHROUGH[key]))
        elif key in owned:
            src = owned[key]
            fix = f"set {src} instead" if not src.startswith(("engine", "run ")) else "remove it: " + src
            out.append(error(pkey, f"is set by hpc-grpo from {src}", fix))
        elif key not in GRPO_CONFIG_FIELDS:
            close = difflib.get_close_matches(key.rsplit(".", 1)[-1], GRPO_CONFIG_FIELDS, n=1, cutoff=0.6)
            if close and close[0] in owned and not owned[close[0]].startswith(("engine", "run ")):
                hint = f"did you mean '{close[0]}'? hpc-grpo sets it from {owned[close[0]]}: set that instead"
            elif close:
                hint = f"did you mean '{close[0]}'?"
            else:
                hint = "see trl's GRPOConfig for the field names"
            if "." in key:
                why = "trl takes GRPOConfig field names, not dotted keys"
            else:
                why = f"is not a field of trl {TRL_VERSION}'s GRPOConfig"
            out.append(error(pkey, why, hint))
    return out
