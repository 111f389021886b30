"""Typed recipes and the resolved RunSpec a run is made from.

Every model forbids unknown keys: a typo in a recipe must fail at the login node with the
closest valid key, not be ignored and discovered hours into a job. Cluster profiles are
hpc_grpo.config.cluster; the rules fields share, hpc_grpo.config.fields; error messages, hpc_grpo.config.keys.
"""

import re
import time
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, field_validator, model_validator

from hpc_grpo.common.closest import closest
from hpc_grpo.common.slurm_time import parse_time_minutes
from hpc_grpo.config.cluster import Cluster
from hpc_grpo.config.engine_traits import traits_of
from hpc_grpo.config.fields import KEEP_BEST_RE, NAME_RE, Strict, expand_path, parse_size, slurm_word
from hpc_grpo.config.secrets import secret_error, secret_in
from hpc_grpo.config import eval_tasks
from hpc_grpo.config import reward_registry as rewards

PASSTHROUGH_KEY_RE = re.compile(r"^(\+\+|\+|~)?[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z0-9_]+)*\Z")


# --------------------------------------------------------------------------------------- recipe
class ModelCfg(Strict):
    """The policy model: a Hub id or a local folder (config.json gives its shape).

    gradient_checkpointing means activation recompute on either backend: FSDP gets
    model.enable_gradient_checkpointing, Megatron (which ignores that key) full uniform recompute.
    """

    path: str = Field(min_length=1, description="a Hugging Face Hub id (ORG/NAME) or a local model folder; `~` and "
                      "$VARS expand at submit (verl: actor_rollout_ref.model.path)")
    dtype: Literal["bfloat16", "float16"] = Field(
        default="bfloat16", description="training dtype; float16 on GPUs without bfloat16 (V100-class) (verl Megatron: "
        "megatron.dtype; trl: bf16/fp16)")
    gradient_checkpointing: bool = Field(
        default=True, description="recompute activations in the backward pass: less memory, more compute (verl FSDP: "
        "model.enable_gradient_checkpointing; Megatron: full uniform recompute; trl: activation_checkpointing)")
    use_remove_padding: bool = Field(
        default=True, description="pack sequences without padding tokens (verl: model.use_remove_padding; off in "
        "verl's CPU mode)")
    trust_remote_code: bool = Field(
        default=False, description="run Python code shipped with the model when loading it (verl and trl: "
        "trust_remote_code)")

    _expand = field_validator("path")(classmethod(lambda cls, v: expand_path(v)))


# verl's data.train_files/val_files take one path or a list (concatenated, e.g. GSM8K + MATH); a list holds >= 1 path
DataFiles = str | Annotated[list[Annotated[str, Field(min_length=1)]], Field(min_length=1)]


def file_list(files: DataFiles) -> list[str]:
    """A data key's files as a list, one path or many: the one place that knows the key takes both."""
    return [files] if isinstance(files, str) else list(files)


class DataCfg(Strict):
    """Prompt files and length limits (verl: data.*). train_files/val_files: one path or a list of paths."""

    train_files: DataFiles = Field(min_length=1, description="training prompts: one file or a list, concatenated; "
                                   "parquet for verl, jsonl for trl (`hpc-grpo data` writes both) (verl: data.train_files)")
    val_files: DataFiles = Field(min_length=1, description="validation prompts, one file or a list (verl: "
                                 "data.val_files)")
    max_prompt_length: int = Field(default=512, gt=0, description="tokens of a prompt at most (verl: "
                                   "data.max_prompt_length)")
    max_response_length: int = Field(default=1024, gt=0, description="tokens generated per response at most (verl: "
                                     "data.max_response_length; trl: max_completion_length)")
    filter_overlong_prompts: bool = Field(default=True, description="drop prompts over max_prompt_length before "
                                          "training (verl: data.filter_overlong_prompts)")
    truncation: Literal["error", "left", "right", "middle"] = Field(
        default="error", description="a prompt over max_prompt_length that reaches the trainer: fail, or cut it on "
        "that side (verl: data.truncation)")
    shuffle: bool = Field(default=True, description="shuffle the training prompts (verl: data.shuffle; trl: "
                          "shuffle_dataset)")
    train_rows: int | None = Field(default=None, gt=0, description="rows in train_files, for plans made where the "
                                   "file is not readable (steps per epoch = rows // batch.train)")

    @field_validator("train_files", "val_files", mode="before")
    @classmethod
    def _shape(cls, v: Any) -> Any:
        """One message for both shapes (pydantic's union errors would name each branch)."""
        ok = (isinstance(v, str) and v) or (isinstance(v, list) and v and all(isinstance(p, str) and p for p in v))
        if not ok:
            raise ValueError("must be one file path or a non-empty list of paths, e.g. [a.parquet,b.parquet] "
                             "(quote a path YAML would read as a number or a boolean)")
        return v

    @field_validator("train_files", "val_files")
    @classmethod
    def _expand(cls, v: DataFiles) -> DataFiles:
        return expand_path(v) if isinstance(v, str) else [expand_path(p) for p in v]

    @property
    def train_list(self) -> list[str]:
        return file_list(self.train_files)

    @property
    def val_list(self) -> list[str]:
        return file_list(self.val_files)


class _SlurmAsk(Strict):
    """What both jobs (training and evaluation) ask Slurm for besides their shape. `time` is a Slurm time limit
    (D-HH:MM:SS, HH:MM:SS, MM:SS or minutes), checked on load; each job sets its own default."""

    _words = field_validator("partition", "account", "qos")(classmethod(lambda cls, v: slurm_word(v)))

    nodes: int = Field(default=1, gt=0, description="nodes the job asks for (sbatch --nodes; verl: trainer.nnodes)")
    gpus_per_node: int | None = Field(default=None, ge=0, description="GPUs per node (sbatch --gpus-per-node or "
                                      "--gres, as the cluster asks); None: the cluster's; 0: a CPU job")
    time: str = Field(description="time limit, in Slurm's format (D-HH:MM:SS, HH:MM:SS, MM:SS or minutes); at most "
                      "the cluster's time_max (sbatch --time)")
    cpus_per_task: int | None = Field(default=None, gt=0, description="CPUs of the job's one task per node (sbatch "
                                      "--cpus-per-task); None: every CPU of the cluster's node")
    mem_gb: int | None = Field(default=None, gt=0, description="memory per node in GB (sbatch --mem); None: Slurm's "
                               "default; at most the cluster's mem_per_node_gb")
    partition: str | None = Field(default=None, description="Slurm partition (sbatch --partition); None: the "
                                  "cluster's")
    account: str | None = Field(default=None, description="Slurm account (sbatch --account); None: the cluster's")
    qos: str | None = Field(default=None, description="Slurm quality of service (sbatch --qos); None: the cluster's")

    @field_validator("time", mode="before")
    @classmethod
    def _time(cls, v: Any) -> str:
        parse_time_minutes(v)
        return str(v)

    @property
    def time_min(self) -> int:
        return parse_time_minutes(self.time)


class Resources(_SlurmAsk):
    """What to ask Slurm for. gpus_per_node defaults to the cluster's."""

    cpu_workers_per_node: int = Field(
        default=1, gt=0, le=64, description="verl's CPU mode (engine verl, gpus_per_node 0): training processes per "
        "node, each holding one of Ray's stand-in GPUs as one process per GPU does on a GPU node (verl: "
        "trainer.n_gpus_per_node)")
    time: str = Field(default="04:00:00", description="the training job's time limit, in Slurm's format "
                      "(D-HH:MM:SS, HH:MM:SS, MM:SS or minutes); at most the cluster's time_max (sbatch --time)")
    max_timeout_requeues: int = Field(
        default=3, ge=0, le=1000, description="how often a time limit may requeue the run (preemptions and node "
        "failures requeue without limit): a run that keeps hitting its limit stops instead of queueing forever")


class Parallel(Strict):
    """Model-parallel layout. tp/pp/cp/ep/vpp are Megatron's; FSDP uses only rollout_tp (and sp)."""

    tp: int = Field(default=1, gt=0, description="Megatron tensor parallel size; divides the attention and KV heads "
                    "(verl: actor/ref megatron.tensor_model_parallel_size)")
    pp: int = Field(default=1, gt=0, description="Megatron pipeline parallel size; divides the layers (verl: "
                    "megatron.pipeline_model_parallel_size)")
    cp: int = Field(default=1, gt=0, description="Megatron context parallel size: each sequence split over this many "
                    "GPUs (verl: megatron.context_parallel_size)")
    ep: int = Field(default=1, gt=0, description="Megatron expert parallel size of a MoE model; divides the experts "
                    "(verl: megatron.expert_model_parallel_size)")
    etp: int | None = Field(default=None, gt=0, description="Megatron expert tensor parallel size; None: not set, "
                            "verl's default (verl: megatron.expert_tensor_parallel_size)")
    vpp: int | None = Field(default=None, gt=0, description="virtual pipeline stages per pipeline rank (interleaved "
                            "schedule); None: off (verl: megatron.virtual_pipeline_model_parallel_size)")
    sequence_parallel: bool = Field(default=False, description="Megatron sequence parallelism within the tensor "
                                    "parallel group (verl: megatron.sequence_parallel)")
    rollout_tp: int = Field(default=1, gt=0, description="tensor parallel size of each rollout engine (verl: "
                            "rollout.tensor_model_parallel_size; trl: vllm_tensor_parallel_size)")


class CodeReward(Strict):
    """Weights and limits of the execution reward (grpo.reward=code_exec; hpc_grpo/rewards/code.py)."""

    pass_weight: float = Field(default=1.0, ge=0, description="times the share of tests passed")
    style_weight: float = Field(default=0.0, ge=0, description="times the pyflakes style score, if a test passed")
    syntax_penalty: float = Field(default=0.2, ge=0, description="subtracted for code that does not compile")
    no_code_penalty: float = Field(default=0.5, ge=0, description="subtracted when the completion holds no code")
    per_test_timeout: float = Field(default=1.0, gt=0, le=60, description="wall seconds per test; the first overrun ends the completion")
    memory_mb: int = Field(default=1024, ge=64, description="memory of the code under test, all its processes together "
                           "(RLIMIT_AS of memory_mb / max_procs each: hpc_grpo/sandbox/sandbox_kernel.py)")
    # hpc_grpo/cluster/isolation.py: auto runs the code in namespaces (root, or a normal user's user namespaces) and
    # refuses where the node has none; limits-only is the explicit consent to resource limits only.
    isolation: Literal["auto", "limits-only"] = Field(
        default="auto", description="auto: namespaces, refused where the node has none; limits-only: limits only")


class Grpo(Strict):
    """The GRPO algorithm: group size, KL regularisation, learning rate."""

    n: int = Field(default=5, ge=2, description="responses per prompt (group size)")
    kl_loss: bool = Field(default=True, description="add KL(policy || reference), weighted by kl_coef, to the "
                          "actor's loss (verl: actor.use_kl_loss; trl: beta is kl_coef, or 0 when off)")
    kl_in_reward: bool = Field(default=False, description="subtract kl_coef x KL from each token's reward before the "
                               "group advantage, verl's other KL (verl: algorithm.use_kl_in_reward)")
    kl_coef: float = Field(default=0.001, ge=0, description="KL weight: the loss's and, with kl_in_reward, the reward's")
    kl_loss_type: Literal["kl", "abs", "mse", "low_var_kl", "full"] = Field(
        default="low_var_kl", description="the loss's KL estimator: kl (k1), abs, mse (k2), low_var_kl (k3, bounded) or "
        "full (verl: actor.kl_loss_type)")
    lr: float = Field(default=1e-6, gt=0, lt=1, description="the actor's learning rate (verl: actor.optim.lr; trl: "
                      "learning_rate)")
    entropy_coeff: float = Field(default=0.0, ge=0, description="weight of the entropy bonus in the actor's loss; 0: "
                                 "none (verl: actor.entropy_coeff; trl: entropy_coef)")
    norm_adv_by_std: bool = Field(default=True, description="divide each group's advantages by its reward's standard "
                                  "deviation (GRPO); false: subtract the group mean only (verl: "
                                  "algorithm.norm_adv_by_std_in_grpo; trl: scale_rewards group or none)")
    temperature: float = Field(default=1.0, gt=0, description="sampling temperature of the rollouts (verl: "
                               "rollout.temperature; trl: temperature)")
    reward: str = Field(default="gsm8k_strict", description="a reward's name in hpc_grpo/config/reward_registry.py")
    format_score: float = Field(default=0.0, ge=0, le=1, description="reward for a parsable but wrong answer")
    code: CodeReward = Field(default_factory=CodeReward, description="the execution reward's weights and limits "
                             "(grpo.reward=code_exec)")

    @field_validator("reward")
    @classmethod
    def _reward(cls, v: str) -> str:
        if v not in rewards.names():
            raise ValueError(f"unknown reward {v!r}: use one of {', '.join(rewards.names())} "
                             "(hpc_grpo/config/reward_registry.py)")
        return v

    @property
    def uses_reference(self) -> bool:
        """Either KL needs the reference model's log-probs (verl builds it for either; utils.need_reference_policy)."""
        return self.kl_loss or self.kl_in_reward


class Batch(Strict):
    """Batch sizes in prompts (train, mini) and samples per GPU (micro)."""

    train: int = Field(default=1024, gt=0, description="prompts per training step, each sampled grpo.n times (verl: "
                       "data.train_batch_size; trl: generation_batch_size)")
    mini: int = Field(default=256, gt=0, description="prompts per optimizer update: train / mini updates per step "
                      "(verl: actor.ppo_mini_batch_size; trl: gradient_accumulation_steps)")
    micro_per_gpu: int | None = Field(default=4, gt=0, description="samples per GPU per forward/backward pass, "
                                      "accumulated up to mini (verl: actor.ppo_micro_batch_size_per_gpu; trl: "
                                      "per_device_train_batch_size); None with dynamic_bsz")
    log_prob_micro_per_gpu: int | None = Field(default=8, gt=0, description="samples per GPU per log-prob pass of "
                                               "the rollout and reference models (verl: "
                                               "log_prob_micro_batch_size_per_gpu); None with dynamic_bsz")
    dynamic_bsz: bool = Field(default=False, description="size micro-batches by tokens, not samples (verl: "
                              "actor.use_dynamic_bsz and the log-prob passes')")
    max_token_len_per_gpu: int | None = Field(default=None, gt=0, description="tokens per GPU per micro-batch with "
                                              "dynamic_bsz; None: max_prompt_length + max_response_length (verl: "
                                              "actor.ppo_max_token_len_per_gpu)")


class Offload(Strict):
    """CPU offload of the actor's parameters/optimizer and the reference model's parameters."""

    param: bool = Field(default=False, description="keep the actor's parameters in CPU memory while another phase "
                        "uses the GPU (verl: actor fsdp_config/megatron.param_offload)")
    optimizer: bool = Field(default=False, description="keep the actor's optimizer states in CPU memory outside the "
                            "update (verl: actor fsdp_config/megatron.optimizer_offload)")
    ref_param: bool = Field(default=True, description="keep the reference model's parameters in CPU memory (verl: "
                            "ref fsdp_config/megatron.param_offload)")


class Lora(Strict):
    """LoRA adapter (rank 0 = full fine-tuning)."""

    rank: int = Field(default=0, ge=0, description="LoRA rank; 0: full fine-tuning (verl: model.lora_rank; trl: "
                      "peft's r)")
    alpha: int = Field(default=16, gt=0, description="LoRA scaling: updates are scaled by alpha / rank (verl: "
                       "model.lora_alpha; trl: lora_alpha)")
    dropout: float = Field(default=0.0, ge=0, lt=1, description="dropout on the adapter's input (verl Megatron: "
                           "model.lora.dropout; trl: lora_dropout)")
    target_modules: str | list[str] = Field(
        default="all-linear", description="modules given adapters: all-linear or a list of module names, checked "
        "against the model's weights by plan (verl: model.target_modules; trl: target_modules)")


class Rollout(Strict):
    """The generation engine used for rollouts."""

    name: Literal["vllm", "sglang", "hf"] = Field(
        default="vllm", description="the generation engine: vllm, sglang, or hf (transformers' generate, no vLLM) "
        "(verl: rollout.name; trl: use_vllm)")
    gpu_memory_utilization: float = Field(default=0.6, gt=0, le=1, description="share of each GPU's memory the "
                                          "rollout engine may take for weights and KV cache (verl: "
                                          "rollout.gpu_memory_utilization)")
    load_format: str | None = Field(default=None, description="how the rollout engine loads the weights; None: "
                                    "verl's default, safetensors with FSDP + LoRA (verl: rollout.load_format)")
    layered_summon: bool = Field(default=False, description="gather FSDP-sharded weights layer by layer when "
                                 "syncing them to the rollout engine: less peak memory (verl: rollout.layered_summon)")
    max_num_seqs: int | None = Field(default=None, gt=0, description="vLLM's concurrent sequences; default: what one engine receives per step")
    enforce_eager: bool = Field(default=False, description="run vLLM without CUDA graphs: less memory, slower "
                                "(verl: rollout.enforce_eager; on in verl's CPU mode)")


class Checkpoint(Strict):
    """How often to save, and the retention policy hpc-grpo applies (the engines' own limits are off).

    Kept: the `keep_last` newest complete checkpoints, every step that is a multiple of `keep_every`, the best by
    `keep_best`; then the oldest are dropped while the total (exports included) is over `max_bytes`. Never removed:
    the newest complete one, verl's tracker step, one younger than `grace_s`, one a reader has leased.
    """

    save_freq: int = Field(default=50, gt=0, description="save every this many training steps, and at the last "
                           "(verl: trainer.save_freq; trl: save_steps)")
    keep_last: int = Field(default=3, gt=0, description="newest complete checkpoints to keep")
    keep_every: int | None = Field(default=None, gt=0, description="also keep steps that are multiples of this")
    keep_best: str | None = Field(default=None, description="METRIC[:max|min]: also keep the best checkpoint")
    max_bytes: int | None = Field(default=None, description="cap on kept checkpoints + exports (e.g. 200G)")
    grace_s: int = Field(default=300, ge=0, description="never remove a checkpoint written this recently")
    quarantine_days: float = Field(default=7.0, ge=0,
                                   description="delete incomplete checkpoints set aside at a job start after")
    disk_gb: float | None = Field(default=None, gt=0, description="GiB of free space the runs root must have; "
                                  "None: what retention keeps, estimated from the checkpoint's size")

    @field_validator("max_bytes", mode="before")
    @classmethod
    def _size(cls, v: Any) -> Any:
        return None if v is None else parse_size(v)

    @field_validator("keep_best")
    @classmethod
    def _best(cls, v: str | None) -> str | None:
        if v is not None and not KEEP_BEST_RE.match(v):
            raise ValueError("use METRIC or METRIC:max or METRIC:min (e.g. val-core/openai/gsm8k/reward/mean@1:max)")
        return v


class EarlyStop(Strict):
    """Stop a run whose validation metric has stopped improving: at each validation (every train.test_freq steps)
    the best value so far is kept; after `patience` validations in a row without an improvement of more than
    `min_delta`, the job saves, stops, and the run counts as trained (its evaluation follows)."""

    metric: str = Field(default="eval_reward", min_length=1, description="the validation metric, as the engine "
                        "logs it (trl: eval_reward, or another eval_* key of trl's evaluation; verl: a "
                        "val-core/... key, e.g. val-core/openai/gsm8k/acc/mean@1)")
    mode: Literal["max", "min"] = Field(default="max", description="max: higher is better (a reward); min: lower "
                                        "is better (a loss)")
    patience: int = Field(default=3, ge=1, description="validations in a row without an improvement before the run "
                          "stops")
    min_delta: float = Field(default=0.0, ge=0, description="the least change over the best value so far that "
                             "counts as an improvement")
    val_rows: int = Field(default=64, ge=1, description="trl: the first this many prompts of data.val_files are "
                          "the validation set (each validation generates grpo.n completions per prompt)")


class Train(Strict):
    """Length of training: epochs, or an explicit step count (which wins, as in verl)."""

    total_epochs: int = Field(default=5, gt=0, description="passes over the training prompts (verl: "
                              "trainer.total_epochs; trl: num_train_epochs)")
    total_training_steps: int | None = Field(default=None, gt=0, description="training steps; wins over "
                                             "total_epochs (verl: trainer.total_training_steps; trl: max_steps)")
    test_freq: int = Field(default=-1, ge=-1, description="validate every this many steps; -1: never (verl: "
                           "trainer.test_freq)")
    val_before_train: bool = Field(default=False, description="validate once before the first step (verl: "
                                   "trainer.val_before_train)")
    seed: int = Field(default=0, ge=0, description="the trl trainer's random seed (trl: seed)")
    early_stop: EarlyStop | None = Field(default=None, description="stop on a validation plateau (needs "
                                         "train.test_freq > 0); None: train every step")


class Logging(Strict):
    """Loggers and the W&B project. The W&B run id is the run's name, so requeues continue one run."""

    logger: list[Literal["console", "wandb", "tensorboard"]] = Field(
        default=["console"], description="where metrics go: console, wandb, tensorboard (verl: trainer.logger, with "
        "its file logger added for keep_best; trl: report_to)")
    project: str = Field(default="hpc-grpo", description="the W&B project (verl: trainer.project_name)")
    experiment: str | None = Field(default=None, description="the experiment's name; None: the run's name (verl: "
                                   "trainer.experiment_name)")
    group: str | None = Field(default=None, description="the W&B group the run joins (WANDB_RUN_GROUP in the "
                              "job's environment, both engines); `sweep` sets it to the sweep's name; None: no group")


class EvalResources(_SlurmAsk):
    """What the evaluation job asks Slurm for: its own shape (one GPU node for vLLM), not the training job's."""

    nodes: Literal[1] = Field(default=1, description="always 1: the evaluation runs on one node")
    gpus_per_node: int | None = Field(default=None, ge=0, description="None: the training job's GPUs per node "
                                      "for vllm, one for hf on a GPU run, none on a CPU run")
    time: str = Field(default="01:00:00", description="the eval job's time limit, in Slurm's format (sbatch --time)")


def default_eval_tasks(reward: str) -> list[str]:
    """The tasks a recipe evaluates after training when it does not set eval.tasks: the skill its reward trains
    (the reward registry's eval_task), none for a reward whose entry names no eval task (then no evaluation follows
    training: Eval.runs). The one place this is decided: Recipe fills eval.tasks from it, so the frozen spec, plan,
    preflight and the eval job all read the same list. An unknown reward gets the default's (grpo.reward's own
    check names it)."""
    name = reward if reward in rewards.names() else Grpo.model_fields["reward"].default
    task = rewards.get(name).eval_task
    return [task] if task is not None else []


def _eval_task(v: str) -> str:
    if v not in eval_tasks.names():
        raise ValueError(f"unknown eval task {v!r}: use one of {', '.join(eval_tasks.names())} "
                         "(hpc_grpo/config/eval_tasks.py)")
    return v


class Eval(Strict):
    """Evaluation after training: GSM8K through lm-eval's own task definitions (offline, on local files), HumanEval
    pass@1 through the training reward's sandbox. Unset tasks follow grpo.reward (default_eval_tasks)."""

    enabled: bool = Field(default=True, description="evaluate the base model and the trained policy after training "
                          "(on Slurm an eval job queued after the training job)")
    tasks: list[str] = Field(
        default_factory=lambda: default_eval_tasks(Grpo.model_fields["reward"].default),
        description="eval tasks (hpc_grpo/config/eval_tasks.py); unset: the eval task of grpo.reward's registry entry "
        "(none for a reward that names no eval task: then no evaluation runs)")
    limit: int | None = Field(default=None, gt=0, description="first K test problems (None: all)")
    num_fewshot: int | None = Field(default=None, ge=0, description="None: the task's own (gsm8k 5, gsm8k_cot 8)")
    backend: Literal["hf", "vllm"] | None = Field(default=None, description="None: vllm when training uses GPUs, "
                                                  "hf on the CPU otherwise (evaluate.eval_resources)")
    batch_size: int = Field(default=8, gt=0, description="prompts per batch of the evaluation (lm-eval's and "
                            "HumanEval's --batch_size)")
    max_gen_toks: int | None = Field(default=None, gt=0, description="None: the task's own (256)")
    test_file: str | None = Field(default=None, description="the lm-eval task's test jsonl (GSM8K: question/answer, "
                                  "MATH: problem/solution); default: test.jsonl beside data.val_files' raw source, "
                                  "see evaluate.data_files")
    train_file: str | None = Field(default=None, description="its train jsonl, for the few-shot examples")
    tp: int | None = Field(default=None, gt=0, description="vLLM tensor parallel size, dividing the eval GPUs "
                           "(None: parallel.rollout_tp); the other GPUs hold data-parallel replicas")
    gpu_memory_utilization: float = Field(default=0.85, gt=0, le=1, description="share of each eval GPU's memory "
                                          "vLLM may take")
    resources: EvalResources = Field(default_factory=EvalResources, description="what the eval job asks Slurm for")

    _expand = field_validator("test_file", "train_file")(
        classmethod(lambda cls, v: None if v is None else expand_path(v))
    )
    _tasks = field_validator("tasks")(classmethod(lambda cls, v: [_eval_task(t) for t in v]))

    @property
    def runs(self) -> bool:
        """Whether an evaluation follows training: enabled and with a task (an empty eval.tasks, as a reward with
        no eval task leaves it, has nothing to evaluate)."""
        return self.enabled and bool(self.tasks)

    def skipped_why(self, reward: str) -> str:
        """Why no evaluation follows training, in words for plan, submit and the job's log ('' when one does)."""
        if not self.enabled:
            return "off (eval.enabled=false); `hpc-grpo eval RUN` evaluates by hand"
        if not self.tasks:
            return (f"skipped: grpo.reward={reward} names no eval task and eval.tasks is empty; set eval.tasks "
                    f"(one of {', '.join(eval_tasks.names())}) to evaluate after training")
        return ""


class Launch(Strict):
    """Replace the engine's driver command (a probe in tests, a custom entry point). A leading `python3` or `python`
    means the job's interpreter (RunSpec.python), as every other in-job step runs it."""

    driver: list[str] | None = Field(default=None, description="argv the job runs instead of the engine's driver; "
                                     "a leading python or python3 is the job's interpreter")
    ray_join_timeout_s: int = Field(default=180, gt=0, description="seconds node 0 waits for every node's Ray worker "
                                    "to join before the job fails, naming the missing nodes")


# The findings runstate/health reports from a run's metric rows, by name (what `health.stop_on` may list):
# weight_sync (the rollout is not the policy being trained), nan, zero_reward, entropy_collapse.
HEALTH_KINDS = ("weight_sync", "nan", "zero_reward", "entropy_collapse")


class Health(Strict):
    """What healthy training of this recipe looks like: status's health hints judge the run's numbers against it,
    not against a 3B run's. The defaults are the reference GPU run's (docs/benchmarks.md); a demo declares its own
    (a random tiny model at lr 2e-2 drifts far from its reference by design, and its 16-token answers are meant to
    reach the length limit)."""

    kl: float = Field(default=0.0027, gt=0, description="the KL to the reference a healthy run of this recipe "
                      "reaches; status hints only at many times it (the reference 3B run's: 0.0027)")
    length_limit_by_design: bool = Field(default=False, description="responses are meant to reach "
                                         "data.max_response_length (a demo's short limit): no cut-off hint")
    reward_note: str = Field(default="", description="one line on what this recipe's reward means (a demo: the "
                             "format bonus, 0% expected on the eval), printed by submit, status and report")
    stop_on: list[str] = Field(default_factory=list, description="health findings that stop the job cleanly (a "
                               "checkpoint, then the reason in the run's history; `hpc-grpo resume` goes on): any "
                               f"of {', '.join(HEALTH_KINDS)}. Every finding is logged and shown by status either way")

    @field_validator("stop_on")
    @classmethod
    def _stop_on(cls, v: list[str]) -> list[str]:
        for kind in v:
            if kind not in HEALTH_KINDS:
                near = closest(kind, HEALTH_KINDS)
                raise ValueError(f"unknown health finding {kind!r}{f' (did you mean {near!r}?)' if near else ''}: "
                                 f"use any of {', '.join(HEALTH_KINDS)}")
        return list(dict.fromkeys(v))


class Recipe(Strict):
    """One training recipe: model, data, layout, algorithm, batches, checkpointing."""

    name: str = Field(description="the recipe's name (its file name without .yaml): letters, digits, '.', '_', '-'")
    description: str = Field(default="", description="one line, shown by `hpc-grpo recipes`")
    engine: Literal["verl", "trl"] = Field(default="verl", description="the trainer: verl (Ray, vLLM, multi-node) or "
                                           "trl (one node, GPU or CPU)")
    backend: Literal["fsdp", "megatron"] = Field(default="fsdp", description="verl's training backend: fsdp or "
                                                 "megatron (trl: fsdp)")
    model: ModelCfg = Field(description="the policy model")
    data: DataCfg = Field(description="prompt files and length limits")
    resources: Resources = Field(default_factory=Resources, description="what the training job asks Slurm for")
    parallel: Parallel = Field(default_factory=Parallel, description="the model-parallel layout")
    grpo: Grpo = Field(default_factory=Grpo, description="the algorithm: group size, KL, learning rate, reward")
    batch: Batch = Field(default_factory=Batch, description="batch sizes")
    offload: Offload = Field(default_factory=Offload, description="CPU offload")
    lora: Lora = Field(default_factory=Lora, description="the LoRA adapter")
    rollout: Rollout = Field(default_factory=Rollout, description="the generation engine")
    checkpoint: Checkpoint = Field(default_factory=Checkpoint, description="saving and retention")
    train: Train = Field(default_factory=Train, description="length of training and validation")
    logging: Logging = Field(default_factory=Logging, description="metrics loggers")
    eval: Eval = Field(default_factory=Eval, description="evaluation after training")
    launch: Launch = Field(default_factory=Launch, description="the job's driver and Ray start-up")
    health: Health = Field(default_factory=Health, description="what healthy training of this recipe looks like "
                           "(status's hints), and which findings stop the job")
    passthrough: dict[str, Any] = Field(
        default_factory=dict, description="engine keys the schema does not model, verbatim"
    )

    @model_validator(mode="before")
    @classmethod
    def _eval_tasks(cls, data: Any) -> Any:
        """eval.tasks left unset (absent or null) -> default_eval_tasks(grpo.reward), before validation, so the
        frozen spec records the list the eval job will run."""
        if not isinstance(data, dict):
            return data
        ev, grpo = data.get("eval"), data.get("grpo")
        if isinstance(ev, Eval):
            if "tasks" in ev.model_fields_set:
                return data
        elif ev is None:
            ev = {}
        elif not isinstance(ev, dict) or ev.get("tasks") is not None:
            return data  # set (or not a mapping: validation says what is wrong)
        reward = (grpo.reward if isinstance(grpo, Grpo) else grpo.get("reward") if isinstance(grpo, dict) else None)
        tasks = default_eval_tasks(reward if isinstance(reward, str) else Grpo.model_fields["reward"].default)
        ev = ev.model_copy(update={"tasks": tasks}) if isinstance(ev, Eval) else {**ev, "tasks": tasks}
        return {**data, "eval": ev}

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not NAME_RE.match(v) or ".." in v:
            raise ValueError("use letters, digits, '.', '_' and '-' only")
        return v

    @field_validator("passthrough")
    @classmethod
    def _passthrough(cls, v: dict[str, Any]) -> dict[str, Any]:
        for key, value in v.items():
            if not PASSTHROUGH_KEY_RE.match(str(key)):
                raise ValueError(
                    f"{key!r} is not an engine key: use dotted names of letters, digits and '_', "
                    "optionally prefixed by '+' or '++'"
                )
            secret = secret_in(str(key), value)
            if secret:
                raise ValueError(str(secret_error(secret)))
        return v


# -------------------------------------------------------------------------------------- run spec
class Acceptance(Strict):
    """An estimate's error the user accepted explicitly (`plan/submit --accept CHECK`), kept in the frozen spec."""

    check: str = Field(description="the accepted check's name, as `--accept CHECK` took it")
    finding: str = Field(default="", description="the error as plan stated it when it was accepted")


# -------------------------------------------------------------------------------------- run spec
class RunSpec(Strict):
    """The frozen spec a run is made from: recipe and cluster resolved, with the run's place."""

    version: str = Field(description="the hpc-grpo version that froze the spec")
    run_name: str = Field(description="the run's name: its folder's name and Slurm's job name")
    run_dir: str = Field(description="the run directory, absolute")
    created: str = Field(description="when the spec was frozen, local time with its UTC offset")
    recipe: Recipe = Field(description="the recipe, overrides applied")
    cluster: Cluster = Field(description="the cluster profile, overrides applied")
    python: str = Field(description="the interpreter every in-job step runs, on every node and restart "
                        "(config.resolve.job_python)")
    overrides: list[str] = Field(default=[], description="the key=value overrides given at submit, in order")
    accepted: list[Acceptance] = Field(default=[], description="plan's errors accepted with `--accept`")

    @property
    def path(self) -> Path:
        return Path(self.run_dir)

    @property
    def gpus_per_node(self) -> int:
        r = self.recipe.resources.gpus_per_node
        return self.cluster.gpus_per_node if r is None else r

    @property
    def cpus_per_task(self) -> int:
        """CPUs of each task (one per node): the recipe's, else every CPU of the cluster's node."""
        r = self.recipe.resources.cpus_per_task
        return self.cluster.cpus_per_node if r is None else r

    @property
    def verl_cpu(self) -> bool:
        """The engine's own CPU mode (verl's real trainer on CPU, hpc_grpo.engines.verl_cpu): a recipe of an engine
        with one (config/engine_traits cpu_mode), given no GPU."""
        return traits_of(self.recipe.engine).cpu_mode and self.gpus_per_node == 0

    @property
    def procs_per_node(self) -> int:
        """Training processes per node: one per GPU, or verl CPU mode's workers."""
        return self.recipe.resources.cpu_workers_per_node if self.verl_cpu else self.gpus_per_node

    @property
    def procs_key(self) -> str:
        """The recipe key that sets procs_per_node (for messages and suggested overrides)."""
        return "resources.cpu_workers_per_node" if self.verl_cpu else "resources.gpus_per_node"

    @property
    def world_size(self) -> int:
        return self.recipe.resources.nodes * self.procs_per_node


def default_run_name(recipe_name: str, now: float | None = None) -> str:
    return f"{recipe_name}-{time.strftime('%Y%m%d-%H%M%S', time.localtime(now))}"
