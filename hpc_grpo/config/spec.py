"""Typed recipes, cluster profiles and the resolved RunSpec a run is made from.

Every model forbids unknown keys: a typo in a recipe must fail at the login node with the
closest valid key, not be ignored and discovered hours into a job.
"""

import difflib
import getpass
import os
import re
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from hpc_grpo.common.yamlio import SpecError

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,79}\Z")
PASSTHROUGH_KEY_RE = re.compile(r"^(\+\+|\+|~)?[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z0-9_]+)*\Z")
# Values that land on #SBATCH lines, which no shell parses, so quoting cannot protect them.
SLURM_WORD_RE = re.compile(r"^[A-Za-z0-9_.,:@+=-]+\Z")
PATH_RE = re.compile(r"^[A-Za-z0-9_./@%+=:,~-]+\Z")


SECRET_ENV = ("WANDB_API_KEY", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN")
HIDDEN = "<hidden>"


def secret_in(key: str, value: Any = None) -> str | None:
    """The dotted path of a secret in `key=value` (its last key, or a key inside a mapping value), else None.

    Anything typed as a setting is written into spec.yaml and the job scripts: a secret there is readable by
    everyone who can read the run directory, so the names in SECRET_ENV are refused at any depth."""
    if key.lstrip("+~").rsplit(".", 1)[-1].upper() in SECRET_ENV:
        return key
    if isinstance(value, dict):
        for k, v in value.items():
            found = secret_in(f"{key}.{k}" if key else str(k), v)
            if found:
                return found
    return None


def secret_error(path: str) -> SpecError:
    """The refusal of a secret: names the key and the fix, never the value."""
    name = path.rsplit(".", 1)[-1].upper()
    where = ("W&B also reads ~/.netrc, which `wandb login` writes" if name == "WANDB_API_KEY"
             else "huggingface_hub also reads the token `huggingface-cli login` stores")
    return SpecError(
        f"{name} is a secret and cannot be a setting: settings are written into the run's frozen spec and the job "
        f"scripts, where anyone who can read the run directory would read it (value not shown). Fix: remove it here "
        f"and `export {name}=...` in the shell you submit from; the job inherits that environment ({where})",
        key=path,
    )


def redact(value: Any) -> Any:
    """`value` for an error message, with the value of every secret key replaced by <hidden>."""
    if isinstance(value, dict):
        return {k: HIDDEN if secret_in(str(k)) else redact(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [redact(v) for v in value]
    return value


def check_name(value: str, what: str) -> str:
    """Names become folder and job names: no path separators, no `..`, no shell metacharacters."""
    if not isinstance(value, str) or not NAME_RE.match(value) or ".." in value:
        raise SpecError(
            f"invalid {what} name {value!r}: use letters, digits, '.', '_' and '-' only "
            "(no '/', no '..', at most 80 characters)",
            key=what,
        )
    return value


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=False, validate_default=True)


# --------------------------------------------------------------------------------------- recipe
def _expand(value: str) -> str:
    """`~` and `$VAR` expanded; $USER falls back to the login name (containers often leave it unset)."""
    env = dict(os.environ)
    env.setdefault("USER", getpass.getuser())
    expanded = re.sub(
        r"\$(\w+)|\$\{(\w+)\}",
        lambda m: env.get(m.group(1) or m.group(2), m.group(0)),
        value,
    )
    return os.path.expanduser(expanded)


def expand_path(value: str) -> str:
    """Expand `~` and `$VAR` now, on the login node: the job script quotes paths, so no shell would."""
    if not isinstance(value, str) or not ("~" in value or "$" in value):
        return value
    expanded = _expand(value)
    if "$" in expanded:
        raise ValueError(f"{value!r} names an environment variable that is not set")
    return expanded


class ModelCfg(Strict):
    """The policy model: a Hub id or a local folder (config.json gives its shape).

    gradient_checkpointing means activation recompute on either backend: FSDP gets
    model.enable_gradient_checkpointing, Megatron (which ignores that key) full uniform recompute.
    """

    path: str = Field(min_length=1)
    dtype: Literal["bfloat16", "float16"] = "bfloat16"
    gradient_checkpointing: bool = True
    use_remove_padding: bool = True
    trust_remote_code: bool = False

    _expand = field_validator("path")(classmethod(lambda cls, v: expand_path(v)))


class DataCfg(Strict):
    """Prompt files and length limits (verl: data.*)."""

    train_files: str = Field(min_length=1)
    val_files: str = Field(min_length=1)
    max_prompt_length: int = Field(default=512, gt=0)
    max_response_length: int = Field(default=1024, gt=0)
    filter_overlong_prompts: bool = True
    truncation: Literal["error", "left", "right", "middle"] = "error"
    shuffle: bool = True
    train_rows: int | None = Field(default=None, gt=0, description="rows in train_files, for plans made where the file is not readable")

    _expand = field_validator("train_files", "val_files")(classmethod(lambda cls, v: expand_path(v)))


def slurm_word(v: str | None) -> str | None:
    """Values on #SBATCH lines: no shell parses those lines, so quoting cannot protect them."""
    if v is not None and not SLURM_WORD_RE.match(v):
        raise ValueError(f"{v!r} cannot go on an #SBATCH line: use letters, digits and . , : @ + = _ - only")
    return v


def parse_time_minutes(value: str | int) -> int:
    """Slurm's time formats -> whole minutes (seconds round up), exactly as sbatch reads them:
    "M", "M:S", "H:M:S", "D-H", "D-H:M", "D-H:M:S"."""
    if isinstance(value, bool):
        raise ValueError("time must be minutes or 'HH:MM:SS', not a boolean")
    text = str(value).strip()
    days, clock = text.split("-", 1) if "-" in text else ("", text)
    parts = clock.split(":")
    if not all(p.isdigit() for p in parts) or ("-" in text and not days.isdigit()) or len(parts) > 3:
        raise ValueError(f"time {value!r} is not minutes, 'M:S', 'H:M:S' or 'D-H[:M[:S]]'")
    nums = [int(p) for p in parts]
    if days:
        h, m, sec = (nums + [0, 0])[:3]
        total_s = ((int(days) * 24 + h) * 60 + m) * 60 + sec
    elif len(nums) == 1:
        total_s = nums[0] * 60
    elif len(nums) == 2:
        total_s = nums[0] * 60 + nums[1]
    else:
        total_s = (nums[0] * 60 + nums[1]) * 60 + nums[2]
    if len(nums) > 1 and (nums[-1] >= 60 or (len(nums) == 3 and nums[1] >= 60)):
        raise ValueError(f"time {value!r}: minutes and seconds must be below 60")
    if total_s <= 0:
        raise ValueError(f"time {value!r} must be positive")
    return -(-total_s // 60)


class SlurmRequest(Strict):
    """The words both jobs' requests share: a time limit (kept as written, read as minutes) and the partition, account
    and qos that go on #SBATCH lines. The fields are the subclasses' own, so their order in spec.yaml stays theirs."""

    if TYPE_CHECKING:
        time: str

    _words = field_validator("partition", "account", "qos", check_fields=False)(
        classmethod(lambda cls, v: slurm_word(v))
    )

    @field_validator("time", mode="before", check_fields=False)
    @classmethod
    def _time(cls, v: Any) -> str:
        parse_time_minutes(v)
        return str(v)

    @property
    def time_min(self) -> int:
        return parse_time_minutes(self.time)


class Resources(SlurmRequest):
    """What to ask Slurm for. gpus_per_node defaults to the cluster's."""

    nodes: int = Field(default=1, gt=0)
    gpus_per_node: int | None = Field(default=None, ge=0)
    # verl on CPU (engine verl, gpus_per_node 0; hpc_grpo.engines.verl_cpu): training processes per node, each
    # holding one of Ray's stand-in GPUs, as one process per GPU does on a GPU node
    cpu_workers_per_node: int = Field(default=1, gt=0, le=64)
    time: str = "04:00:00"
    cpus_per_task: int | None = Field(default=None, gt=0)
    mem_gb: int | None = Field(default=None, gt=0)
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    # How often a time limit may requeue the run (preemptions and node failures requeue without limit): a run
    # that keeps hitting its limit is stopped instead of queueing forever.
    max_timeout_requeues: int = Field(default=3, ge=0, le=1000)


class Parallel(Strict):
    """Model-parallel layout. tp/pp/cp/ep/vpp are Megatron's; FSDP uses only rollout_tp (and sp)."""

    tp: int = Field(default=1, gt=0)
    pp: int = Field(default=1, gt=0)
    cp: int = Field(default=1, gt=0)
    ep: int = Field(default=1, gt=0)
    etp: int | None = Field(default=None, gt=0)
    vpp: int | None = Field(default=None, gt=0)
    sequence_parallel: bool = False
    rollout_tp: int = Field(default=1, gt=0)


class CodeReward(Strict):
    """Weights and limits of the execution reward (grpo.reward=code_exec; hpc_grpo/rewards/code.py)."""

    pass_weight: float = Field(default=1.0, ge=0, description="times the share of tests passed")
    style_weight: float = Field(default=0.0, ge=0, description="times the pyflakes style score, if a test passed")
    syntax_penalty: float = Field(default=0.2, ge=0, description="subtracted for code that does not compile")
    no_code_penalty: float = Field(default=0.5, ge=0, description="subtracted when the completion holds no code")
    per_test_timeout: float = Field(default=1.0, gt=0, le=60, description="wall seconds per test; the first overrun ends the completion")
    memory_mb: int = Field(default=1024, ge=64, description="address-space limit of the code under test")
    # hpc_grpo.cluster.isolation.py: auto runs the code in namespaces (root, or a normal user's user namespaces) and
    # refuses where the node has none; limits-only is the explicit consent to resource limits only.
    isolation: Literal["auto", "limits-only"] = Field(
        default="auto", description="auto: namespaces, refused where the node has none; limits-only: limits only")


class Grpo(Strict):
    """The GRPO algorithm: group size, KL regularisation, learning rate."""

    n: int = Field(default=5, ge=2, description="responses per prompt (group size)")
    kl_loss: bool = True
    kl_coef: float = Field(default=0.001, ge=0)
    kl_loss_type: Literal["kl", "abs", "mse", "low_var_kl", "full"] = "low_var_kl"
    lr: float = Field(default=1e-6, gt=0, lt=1)
    entropy_coeff: float = Field(default=0.0, ge=0)
    norm_adv_by_std: bool = True
    temperature: float = Field(default=1.0, gt=0)
    reward: Literal["gsm8k_strict", "gsm8k_flexible", "code_exec"] = "gsm8k_strict"
    format_score: float = Field(default=0.0, ge=0, le=1, description="reward for a parsable but wrong answer")
    code: CodeReward = Field(default_factory=CodeReward)


class Batch(Strict):
    """Batch sizes in prompts (train, mini) and samples per GPU (micro)."""

    train: int = Field(default=1024, gt=0)
    mini: int = Field(default=256, gt=0)
    micro_per_gpu: int | None = Field(default=4, gt=0)
    log_prob_micro_per_gpu: int | None = Field(default=8, gt=0)
    dynamic_bsz: bool = False
    max_token_len_per_gpu: int | None = Field(default=None, gt=0)


class Offload(Strict):
    """CPU offload of the actor's parameters/optimizer and the reference model's parameters."""

    param: bool = False
    optimizer: bool = False
    ref_param: bool = True


class Lora(Strict):
    """LoRA adapter (rank 0 = full fine-tuning)."""

    rank: int = Field(default=0, ge=0)
    alpha: int = Field(default=16, gt=0)
    dropout: float = Field(default=0.0, ge=0, lt=1)
    target_modules: str | list[str] = "all-linear"


class Rollout(Strict):
    """The generation engine used for rollouts."""

    name: Literal["vllm", "sglang", "hf"] = "vllm"
    gpu_memory_utilization: float = Field(default=0.6, gt=0, le=1)
    load_format: str | None = None
    layered_summon: bool = False
    max_num_seqs: int | None = Field(default=None, gt=0, description="vLLM's concurrent sequences; default: what one engine receives per step")
    enforce_eager: bool = False


SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGTP]?)(i?B?)?\s*\Z", re.IGNORECASE)
KEEP_BEST_RE = re.compile(r"^[^:\s]+(:(max|min))?\Z")


def parse_size(value: int | str) -> int:
    """Bytes from 123, "500M", "1.5T", "200GiB" (powers of 1024: disk tools and quotas count that way)."""
    if isinstance(value, bool):
        raise ValueError("is a boolean, not a size")
    if isinstance(value, int):
        if value <= 0:
            raise ValueError("must be > 0 bytes")
        return value
    m = SIZE_RE.match(str(value))
    if not m:
        raise ValueError("is not a size: use bytes or a number with K, M, G, T or P (e.g. 200G)")
    unit = m.group(2).upper()
    n = int(float(m.group(1)) * 1024 ** ("KMGTP".index(unit) + 1 if unit else 0))
    if n <= 0:
        raise ValueError("must be > 0 bytes")
    return n


class Checkpoint(Strict):
    """How often to save, and the retention policy hpc-grpo applies (the engines' own limits are off).

    `keep` is the old name of `keep_last` and still accepted. Kept: the `keep_last` newest complete
    checkpoints, every step that is a multiple of `keep_every`, the best by `keep_best`; then the
    oldest are dropped while the total (exports included) is over `max_bytes`. Never removed: the
    newest complete one, verl's tracker step, one younger than `grace_s`, one a reader has leased.
    """

    save_freq: int = Field(default=50, gt=0)
    keep_last: int = Field(default=3, gt=0, description="newest complete checkpoints to keep")
    keep_every: int | None = Field(default=None, gt=0, description="also keep steps that are multiples of this")
    keep_best: str | None = Field(default=None, description="METRIC[:max|min]: also keep the best checkpoint")
    max_bytes: int | None = Field(default=None, description="cap on kept checkpoints + exports (e.g. 200G)")
    grace_s: int = Field(default=300, ge=0, description="never remove a checkpoint written this recently")
    quarantine_days: float = Field(default=7.0, ge=0,
                                   description="delete incomplete checkpoints set aside at a job start after")
    disk_gb: float | None = Field(default=None, gt=0, description="free space to require")

    @model_validator(mode="before")
    @classmethod
    def _old_keep(cls, data: Any) -> Any:
        """`keep: N` (recipes before retention) means keep_last N. Files and overrides are renamed earlier, where
        precedence is known (resolve, ACCEPTED_ALIASES); here, for data built in code, keep_last wins when both are set."""
        if isinstance(data, dict) and "keep" in data:
            data = dict(data)
            keep = data.pop("keep")
            data.setdefault("keep_last", keep)
        return data

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


class Train(Strict):
    """Length of training: epochs, or an explicit step count (which wins, as in verl)."""

    total_epochs: int = Field(default=5, gt=0)
    total_training_steps: int | None = Field(default=None, gt=0)
    test_freq: int = Field(default=-1, ge=-1)
    val_before_train: bool = False
    seed: int = Field(default=0, ge=0)


class Logging(Strict):
    """Loggers and the W&B project. The W&B run id is the run's name, so requeues continue one run."""

    logger: list[Literal["console", "wandb", "tensorboard"]] = ["console"]
    project: str = "hpc-grpo"
    experiment: str | None = None


class EvalResources(SlurmRequest):
    """What the evaluation job asks Slurm for: its own shape (one GPU node for vLLM), not the training job's."""

    nodes: Literal[1] = 1
    gpus_per_node: int | None = Field(default=None, ge=0, description="None: the training job's GPUs per node "
                                      "for vllm, one for hf on a GPU run, none on a CPU run")
    time: str = "01:00:00"
    cpus_per_task: int | None = Field(default=None, gt=0)
    mem_gb: int | None = Field(default=None, gt=0)
    partition: str | None = None
    account: str | None = None
    qos: str | None = None


EVAL_TASKS = ("gsm8k", "gsm8k_cot", "humaneval")
GSM8K_TASKS = ("gsm8k", "gsm8k_cot")  # lm-eval tasks on the GSM8K files; humaneval needs none


class Eval(Strict):
    """GSM8K evaluation after training (lm-eval's own task definitions, run offline on local files)."""

    enabled: bool = True
    tasks: list[Literal["gsm8k", "gsm8k_cot", "humaneval"]] = Field(default_factory=lambda: ["gsm8k"], min_length=1)
    limit: int | None = Field(default=None, gt=0, description="first K test problems (None: all 1319)")
    num_fewshot: int | None = Field(default=None, ge=0, description="None: the task's own (gsm8k 5, gsm8k_cot 8)")
    backend: Literal["hf", "vllm"] | None = Field(default=None, description="None: vllm when training uses GPUs, "
                                                  "hf on the CPU otherwise (evaluate.eval_resources)")
    batch_size: int = Field(default=8, gt=0)
    max_gen_toks: int | None = Field(default=None, gt=0, description="None: the task's own (256)")
    test_file: str | None = Field(default=None, description="GSM8K test jsonl (question/answer); default: "
                                  "test.jsonl beside data.val_files' raw source, see evaluate.data_files")
    train_file: str | None = Field(default=None, description="GSM8K train jsonl for the few-shot examples")
    tp: int | None = Field(default=None, gt=0, description="vLLM tensor parallel size, dividing the eval GPUs "
                           "(None: parallel.rollout_tp); the other GPUs hold data-parallel replicas")
    gpu_memory_utilization: float = Field(default=0.85, gt=0, le=1)
    resources: EvalResources = Field(default_factory=EvalResources)

    _expand = field_validator("test_file", "train_file")(
        classmethod(lambda cls, v: None if v is None else expand_path(v))
    )


class Launch(Strict):
    """Replace the engine's driver command (a probe in tests, a custom entry point). A leading `python3` or `python`
    means the job's interpreter (RunSpec.python), as every other in-job step runs it."""

    driver: list[str] | None = None
    ray_join_timeout_s: int = Field(default=180, gt=0)


class Recipe(Strict):
    """One training recipe: model, data, layout, algorithm, batches, checkpointing."""

    name: str
    description: str = ""
    engine: Literal["verl", "trl"] = "verl"
    backend: Literal["fsdp", "megatron"] = "fsdp"
    model: ModelCfg
    data: DataCfg
    resources: Resources = Field(default_factory=Resources)
    parallel: Parallel = Field(default_factory=Parallel)
    grpo: Grpo = Field(default_factory=Grpo)
    batch: Batch = Field(default_factory=Batch)
    offload: Offload = Field(default_factory=Offload)
    lora: Lora = Field(default_factory=Lora)
    rollout: Rollout = Field(default_factory=Rollout)
    checkpoint: Checkpoint = Field(default_factory=Checkpoint)
    train: Train = Field(default_factory=Train)
    logging: Logging = Field(default_factory=Logging)
    eval: Eval = Field(default_factory=Eval)
    launch: Launch = Field(default_factory=Launch)
    passthrough: dict[str, Any] = Field(
        default_factory=dict, description="engine keys the schema does not model, verbatim"
    )

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


# -------------------------------------------------------------------------------------- cluster
class Setup(Strict):
    """Environment set-up before the job runs; each value is quoted into the script."""

    modules: list[str] = []
    venv: str | None = None
    conda: str | None = None
    container: str | None = None
    # The interpreter every in-job step runs (submitit's task, Ray's CLI, the drivers). Unset: <venv>/bin/python,
    # else python3 of the conda env / container, else the interpreter that submitted (hpc_grpo.config.resolve.job_python).
    python: str | None = None

    _expand = field_validator("venv", "conda", "python")(
        classmethod(lambda cls, v: None if v is None else expand_path(v))
    )


class Cluster(Strict):
    """One cluster profile: scheduler, partition, node shape, NCCL/network env, scratch root."""

    name: str
    description: str = ""
    scheduler: Literal["slurm", "local"] = "slurm"
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    nodes_max: int = Field(default=1, gt=0)
    gpus_per_node: int = Field(default=0, ge=0)
    gpu_type: str | None = None
    gpu_memory_gb: float = Field(default=80, gt=0)
    cpus_per_node: int = Field(default=8, gt=0)
    mem_per_node_gb: float = Field(default=64, gt=0)
    gpu_request: Literal["gpus-per-node", "gres"] = "gpus-per-node"
    time_max: str = "2-00:00:00"
    signal_delay_s: int = Field(default=120, ge=0)
    requeue: bool = True
    # How a run carries on after a time limit or preemption: "requeue" (the job requeues itself, scontrol requeue)
    # or "chain" (for sites where users may not requeue: each job queues its follow-on with
    # --dependency=afternotok:<job>, which resumes only after TIMEOUT, PREEMPTED or NODE_FAIL).
    restart: Literal["requeue", "chain"] = "requeue"
    runs_root: str = "~/hpc-grpo-runs"
    shared_paths: list[str] = Field(default_factory=list, description="folders every node sees (checked for nodes > 1)")
    offline: bool = Field(default=False, description="compute nodes cannot reach the Hugging Face Hub")
    slurm_cluster_name: str | None = Field(default=None, description="Slurm's ClusterName: picks this profile")
    # scheduler=local: the address a Ray job binds to. Loopback, so nothing leaves the machine, but not 127.0.0.1:
    # Ray silently rewrites 127.0.0.1 and localhost to the machine's external address.
    local_address: str = Field(default="127.0.0.2", description="scheduler=local: the job's Ray address (127.0.0.0/8, "
                                                                 "not 127.0.0.1)")
    setup: Setup = Field(default_factory=Setup)
    env: dict[str, str] = {}

    @field_validator("local_address")
    @classmethod
    def _local_address(cls, v: str) -> str:
        import ipaddress

        try:
            addr = ipaddress.IPv4Address(v)
        except ValueError:
            raise ValueError(f"{v!r} is not an IPv4 address") from None
        if not addr.is_loopback or addr == ipaddress.IPv4Address("127.0.0.1"):
            raise ValueError(f"{v}: use a loopback address other than 127.0.0.1 (Ray rewrites that one to the "
                             "machine's external address), e.g. 127.0.0.2")
        return str(addr)

    @field_validator("time_max", mode="before")
    @classmethod
    def _time(cls, v: Any) -> str:
        parse_time_minutes(v)
        return str(v)

    _words = field_validator("partition", "account", "qos", "gpu_type")(classmethod(lambda cls, v: slurm_word(v)))

    @field_validator("runs_root")
    @classmethod
    def _runs_root(cls, v: str) -> str:
        if not PATH_RE.match(v.replace("$", "")):
            raise ValueError(f"{v!r}: the runs root goes on #SBATCH lines; use no spaces or shell characters")
        return v

    @field_validator("env")
    @classmethod
    def _env(cls, v: dict[str, str]) -> dict[str, str]:
        for key in v:
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
                raise ValueError(f"{key!r} is not a valid environment variable name")
            if secret_in(key):
                raise ValueError(str(secret_error(key)))
        return v

    @property
    def time_max_min(self) -> int:
        return parse_time_minutes(self.time_max)

    def shared_path_list(self) -> list[Path]:
        """shared_paths with ~ and $VARS expanded (an unset variable leaves the entry out: it cannot match)."""
        out = []
        for item in self.shared_paths:
            expanded = _expand(item)
            if "$" not in expanded:
                out.append(Path(expanded).absolute())
        return out

    def runs_root_path(self) -> Path:
        """runs_root with ~ and $VARS expanded; an unset variable is an error, not a literal '$'."""
        expanded = _expand(self.runs_root)
        if "$" in expanded:
            raise SpecError(
                f"{self.runs_root!r} names an environment variable that is not set; "
                "set it or write an absolute path",
                key="cluster.runs_root",
            )
        return Path(expanded).absolute()




# -------------------------------------------------------------------------------------- run spec
class RunSpec(Strict):
    """The frozen spec a run is made from: recipe and cluster resolved, with the run's place."""

    version: str
    run_name: str
    run_dir: str
    created: str
    recipe: Recipe
    cluster: Cluster
    # Frozen at render/submit time: one interpreter for every in-job step, on every node and restart.
    python: str
    overrides: list[str] = []

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
        """verl's real trainer on CPU (hpc_grpo.engines.verl_cpu): a verl recipe given no GPU."""
        return self.recipe.engine == "verl" and self.gpus_per_node == 0

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


# ------------------------------------------------------------------------------- error handling
def _model_at(model: type[BaseModel], loc: tuple[Any, ...]) -> type[BaseModel] | None:
    """Walk a pydantic model class along an error location to the model that owns the last key."""
    current: type[BaseModel] = model
    for part in loc[:-1]:
        field = current.model_fields.get(str(part))
        if field is None:
            return None
        ann = field.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            current = ann
        else:
            return None
    return current


# Names users bring from verl, trl or the field reports, and the recipe key that means the same.
ALIASES = {
    "grpo.group_size": "grpo.n",
    "grpo.num_generations": "grpo.n",
    "grpo.rollout_n": "grpo.n",
    "grpo.beta": "grpo.kl_coef",
    "grpo.kl_loss_coef": "grpo.kl_coef",
    "grpo.learning_rate": "grpo.lr",
    "batch.train_batch_size": "batch.train",
    "batch.ppo_mini_batch_size": "batch.mini",
    "batch.ppo_micro_batch_size_per_gpu": "batch.micro_per_gpu",
    "batch.use_dynamic_bsz": "batch.dynamic_bsz",
    "data.train_batch_size": "batch.train",
    "parallel.tensor_model_parallel_size": "parallel.tp",
    "parallel.pipeline_model_parallel_size": "parallel.pp",
    "parallel.expert_model_parallel_size": "parallel.ep",
    "parallel.context_parallel_size": "parallel.cp",
    "checkpoint.max_actor_ckpt_to_keep": "checkpoint.keep_last",
    "checkpoint.save_total_limit": "checkpoint.keep_last",
    "checkpoint.keep_latest_k": "checkpoint.keep_last",
    "checkpoint.max_mem": "checkpoint.max_bytes",
    "train.max_steps": "train.total_training_steps",
    "resources.n_gpus_per_node": "resources.gpus_per_node",
    "resources.nnodes": "resources.nodes",
}


# Old names that are still accepted (ALIASES above are only suggested): each is renamed to its new name where it is
# written, a file or the command line, so a value under the old name takes the same precedence as one under the new.
ACCEPTED_ALIASES = {
    "checkpoint.keep": "checkpoint.keep_last",
}


def canonical_key(key: str) -> str:
    """The recipe key an accepted old name stands for (itself for every other key)."""
    return ACCEPTED_ALIASES.get(key, key)


def did_you_mean(model: type[BaseModel], loc: tuple[Any, ...]) -> str:
    dotted = ".".join(map(str, loc))
    if model is Recipe and dotted in ALIASES:
        return f"did you mean '{ALIASES[dotted]}'? "
    owner = _model_at(model, loc)
    if owner is None:
        return ""
    names = list(owner.model_fields)
    close = difflib.get_close_matches(str(loc[-1]), names, n=1, cutoff=0.5)
    if close:
        return f"did you mean '{'.'.join(map(str, (*loc[:-1], close[0])))}'? "
    return f"valid keys here: {', '.join(names)}. "


def validation_error(
    exc: ValidationError, model: type[BaseModel], where: dict[str, str], prefix: str = ""
) -> SpecError:
    """Turn pydantic's error into one message per bad key: where it was set, what is wrong, the fix."""
    parts: list[str] = []
    first_key = ""
    for err in exc.errors():
        loc = tuple(err["loc"])
        key = prefix + ".".join(str(p) for p in loc)
        first_key = first_key or key
        dotted = ".".join(str(p) for p in loc)
        origin = where.get(dotted) or next((v for k, v in where.items() if k.startswith(dotted + ".")), "")
        origin = f" ({origin})" if origin else ""
        if err["type"] == "extra_forbidden":
            msg = f"unknown key{origin}; {did_you_mean(model, loc)}".rstrip()
        elif err["type"] == "missing":
            msg = f"required key is missing{origin}"
        else:
            text = str(err["msg"]).removeprefix("Value error, ")
            shown = HIDDEN if any(secret_in(str(p)) for p in loc) else redact(err.get("input"))
            msg = f"{text}, got {shown!r}{origin}"
        parts.append(f"{key}: {msg}")
    return SpecError("\n  ".join(parts), key=first_key)
