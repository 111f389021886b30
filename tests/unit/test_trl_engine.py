"""trl engine adapter: RunSpec -> GRPOConfig/LoraConfig kwargs (checked against the real classes),
the pre-submit checks (checkpoint completeness: test_checkpoints.py)."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # before transformers/trl are imported anywhere in this module

from hpc_grpo.runstate import runs  # noqa: E402
from hpc_grpo.engines import get_engine  # noqa: E402
from hpc_grpo.engines.trl import (  # noqa: E402
    GRPO_CONFIG_FIELDS,
    TRL_VERSION,
    TrlEngine,
    batch_layout,
    grpo_config_kwargs,
    lora_config_kwargs,
)
from hpc_grpo.common.findings import Severity  # noqa: E402
from hpc_grpo.config.resolve import resolve_spec  # noqa: E402
from hpc_grpo.config.spec import RunSpec  # noqa: E402

REPO = Path(__file__).resolve().parents[2]


def tiny(tmp_path: Path, *overrides: str) -> RunSpec:
    return resolve_spec("tiny-gsm8k", "local", overrides=[f"cluster.runs_root={tmp_path}", *overrides], run_name="t")


def errors(spec: RunSpec) -> dict[str, str]:
    return {f.key: str(f) for f in TrlEngine().check(spec) if f.severity is Severity.ERROR}


# ------------------------------------------------------------------------------------------ mapping
def test_command_and_registry(tmp_path: Path) -> None:
    spec = tiny(tmp_path)
    engine = get_engine("trl")
    assert isinstance(engine, TrlEngine) and engine.name == "trl" and engine.launch_template == "trl_launch.sh.j2"
    cmd = engine.command(spec)
    assert cmd.argv == [spec.python, "-m", "hpc_grpo.job.trl_job", "--spec", f"{tmp_path}/t/spec.yaml"]
    # one W&B run per run directory: the run name plus a hash of the directory (two roots, two W&B runs)
    assert cmd.env == {"WANDB_RUN_ID": runs.wandb_run_id(tmp_path / "t"), "WANDB_RESUME": "allow"}
    assert cmd.env["WANDB_RUN_ID"].startswith("t-")


def test_module_import_is_light() -> None:
    """`hpc-grpo plan` imports the adapter: no torch/transformers/trl on that path."""
    code = ("import sys, hpc_grpo.engines.trl, hpc_grpo.job.trl_job; "
            "print(sorted(m for m in ('torch', 'transformers', 'trl', 'peft', 'datasets', 'wandb') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_grpo_kwargs_from_tiny_recipe(tmp_path: Path) -> None:
    kw = grpo_config_kwargs(tiny(tmp_path), use_cpu=True)
    expected = {
        "output_dir": f"{tmp_path}/t/checkpoints",
        "run_name": "t",
        "num_generations": 4,
        "max_completion_length": 32,
        "learning_rate": 2e-2,
        "beta": 0.001,
        "temperature": 1.0,
        "per_device_train_batch_size": 8,  # batch.micro_per_gpu (completions)
        "gradient_accumulation_steps": 4,  # mini 8 prompts x 4 completions / micro 8
        "generation_batch_size": 32,  # train 8 prompts x n 4
        "save_strategy": "steps",
        "save_steps": 4,
        "save_total_limit": None,  # hpc-grpo prunes (checkpoint.keep_last): trl's rotation is off
        "max_steps": 24,
        "num_train_epochs": 1,
        "seed": 0,
        "logging_steps": 1,
        "report_to": "none",
        "use_cpu": True,
        "bf16": False,
        "fp16": False,
        "use_vllm": False,
        "lr_scheduler_type": "constant",
    }
    assert {k: kw[k] for k in expected} == expected
    assert "max_prompt_length" not in kw  # not a GRPOConfig field in trl 1.16: the job filters prompts
    assert set(kw) <= set(GRPO_CONFIG_FIELDS)


def test_grpo_kwargs_variants(tmp_path: Path) -> None:
    spec = tiny(tmp_path, "grpo.kl_loss=false", "grpo.norm_adv_by_std=false", "logging.logger=[console,wandb]",
                "train.total_training_steps=null", "train.total_epochs=3", "grpo.entropy_coeff=0.01")
    kw = grpo_config_kwargs(spec, use_cpu=True)
    assert kw["beta"] == 0.0 and kw["scale_rewards"] == "none" and kw["entropy_coef"] == 0.01
    assert kw["report_to"] == ["wandb"]
    assert kw["max_steps"] == -1 and kw["num_train_epochs"] == 3

    gpu = grpo_config_kwargs(tiny(tmp_path, "rollout.name=vllm", "resources.gpus_per_node=1"))  # use_cpu from the spec
    assert gpu["use_cpu"] is False and gpu["bf16"] is True and gpu["fp16"] is False
    assert gpu["use_vllm"] is True and gpu["vllm_mode"] == "colocate" and gpu["vllm_gpu_memory_utilization"] == 0.6
    assert grpo_config_kwargs(tiny(tmp_path))["use_cpu"] is True  # the recipe asks for no GPU


def test_train_larger_than_mini_splits_each_step_into_updates(tmp_path: Path) -> None:
    """verl semantics: a step generates batch.train prompts; each batch.mini of them is one update."""
    spec = tiny(tmp_path, "batch.train=16", "batch.mini=8", "batch.micro_per_gpu=16")
    lay = batch_layout(spec)
    assert (lay.per_device, lay.grad_accum, lay.generation_batch, lay.updates_per_step) == (16, 2, 64, 2)
    kw = grpo_config_kwargs(spec, use_cpu=True)
    assert (kw["max_steps"], kw["save_steps"]) == (48, 8)  # trl counts optimizer updates


def test_passthrough_is_applied_last(tmp_path: Path) -> None:
    spec = tiny(tmp_path, "passthrough.epsilon=0.3", "passthrough.lr_scheduler_type=cosine")
    kw = grpo_config_kwargs(spec, use_cpu=True)
    assert kw["epsilon"] == 0.3 and kw["lr_scheduler_type"] == "cosine"
    assert not errors(spec)


def test_real_grpo_config_accepts_the_kwargs(tmp_path: Path) -> None:
    """Constructing trl's own GRPOConfig catches a misspelt or removed field name."""
    from trl import GRPOConfig

    for overrides in ((), ("batch.train=16", "batch.mini=8", "passthrough.epsilon=0.3"),
                      ("logging.logger=[console,wandb]", "grpo.kl_loss=false")):
        spec = tiny(tmp_path, *overrides)
        cfg = GRPOConfig(**grpo_config_kwargs(spec, use_cpu=True))
        lay = batch_layout(spec)
        assert cfg.generation_batch_size == lay.generation_batch
        assert cfg.steps_per_generation == lay.generation_batch // lay.per_device
        assert cfg.gradient_accumulation_steps == lay.grad_accum
        assert cfg.use_cpu is True and cfg.bf16 is False
        assert cfg.activation_checkpointing is True and cfg.save_only_model is False


def test_static_field_list_matches_installed_trl() -> None:
    import trl
    from trl import GRPOConfig

    installed = tuple(f.name for f in dataclasses.fields(GRPOConfig))
    assert trl.__version__ == TRL_VERSION, f"trl {trl.__version__} installed: regenerate GRPO_CONFIG_FIELDS"
    assert GRPO_CONFIG_FIELDS == installed


def test_lora_kwargs(tmp_path: Path) -> None:
    from peft import LoraConfig

    kw = lora_config_kwargs(tiny(tmp_path))
    assert kw == {"r": 8, "lora_alpha": 16, "lora_dropout": 0.0, "target_modules": "all-linear", "task_type": "CAUSAL_LM"}
    assert LoraConfig(**kw).target_modules == "all-linear"
    listed = lora_config_kwargs(tiny(tmp_path, "lora.target_modules=[q_proj,v_proj]", "lora.dropout=0.05"))
    assert listed is not None and listed["target_modules"] == ["q_proj", "v_proj"] and listed["lora_dropout"] == 0.05
    assert set(LoraConfig(**listed).target_modules) == {"q_proj", "v_proj"}
    assert lora_config_kwargs(tiny(tmp_path, "lora.rank=0")) is None  # full fine-tuning


# ------------------------------------------------------------------------------------------- checks
def test_tiny_recipe_has_no_findings(tmp_path: Path) -> None:
    assert TrlEngine().check(tiny(tmp_path)) == []


@pytest.mark.parametrize(
    ("overrides", "key", "text"),
    [
        (["passthrough.learning_rat=0.1"], "passthrough.learning_rat", "sets it from grpo.lr"),
        (["passthrough.epsilom=0.3"], "passthrough.epsilom", "did you mean 'epsilon'"),
        (["passthrough.learning_rate=0.1"], "passthrough.learning_rate", "set grpo.lr instead"),
        (["passthrough.num_generations=8"], "passthrough.num_generations", "set grpo.n instead"),
        (["passthrough.output_dir=/tmp/x"], "passthrough.output_dir", "remove it"),
        (["passthrough.resume_from_checkpoint=true"], "passthrough.resume_from_checkpoint", "newest complete"),
        (["actor_rollout_ref.actor.optim.lr=0.1"], "passthrough.actor_rollout_ref.actor.optim.lr", "not dotted keys"),
        (["rollout.name=vllm"], "rollout.name", "need a GPU"),
        (["rollout.name=sglang"], "rollout.name", "no sglang rollout"),
        (["batch.train=12", "batch.mini=8"], "batch.mini", "not a multiple"),
        (["batch.micro_per_gpu=12"], "batch.micro_per_gpu", "8x4 = 32"),
        (["backend=megatron"], "backend", "no megatron backend"),
        (["data.train_files=/data/train.csv"], "data.train_files", "not a .jsonl"),
    ],
)
def test_check_errors(tmp_path: Path, overrides: list[str], key: str, text: str) -> None:
    found = errors(tiny(tmp_path, *overrides))
    assert key in found, found
    assert text in found[key]


def test_check_warnings(tmp_path: Path) -> None:
    spec = tiny(tmp_path, "rollout.name=vllm", "resources.gpus_per_node=2", "batch.dynamic_bsz=true",
                "grpo.kl_loss_type=kl", "data.filter_overlong_prompts=false", "data.truncation=left",
                "train.test_freq=5")
    found = TrlEngine().check(spec)
    assert not [f for f in found if f.severity is Severity.ERROR], found
    warned = {f.key for f in found if f.severity is Severity.WARNING}
    assert warned == {"rollout.name", "resources.gpus_per_node", "batch.dynamic_bsz", "grpo.kl_loss_type",
                      "data.truncation", "train.test_freq"}
