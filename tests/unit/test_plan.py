"""Plan: its findings and tables on the shipped recipes. Every shipped recipe x cluster pair's verdict is
docs/recipe-matrix.md, held to plan's by test_recipe_matrix.py.
"""

from __future__ import annotations


import pytest

from hpc_grpo.common.findings import Severity
from hpc_grpo.config.resolve import resolve_spec
from hpc_grpo.planning.plan import run_plan
from tests.cli_run import run_cli


def plan_of(recipe: str, cluster: str, *overrides: str, schema: bool = False):
    return run_plan(resolve_spec(recipe, cluster, ["cluster.runs_root=/nonexistent/runs", *overrides], run_name="t"),
                    schema=schema)


def errors(plan) -> list:
    return [f for f in plan.findings if f.severity is Severity.ERROR]


def test_codegen_on_a100_plans_and_prints_tables(isolated, monkeypatch, capsys) -> None:
    code, text = run_cli(monkeypatch, capsys, "plan", "recipe=qwen2.5-7b-codegen", "cluster=a100-ib",
                         "cluster.runs_root=/nonexistent/runs")
    assert code == 0, text
    assert "Layout" in text and "Memory per GPU" in text and "peak" in text


def test_tp3_names_head_divisibility(isolated, monkeypatch, capsys) -> None:
    code, text = run_cli(monkeypatch, capsys, "plan", "recipe=qwen2.5-7b-codegen", "cluster=a100-ib", "parallel.tp=3",
                         "--json")
    assert code == 1
    assert "28 attention heads, not divisible by TP 3" in text


@pytest.mark.parametrize("override", ["algorithm.group_size=5", "passthrough.algorithm.group_size=5",
                                      "+algorithm.group_size=5"])
def test_field_report_group_size_names_rollout_n(override, isolated, monkeypatch, capsys) -> None:
    code, text = run_cli(monkeypatch, capsys, "plan", "recipe=qwen2.5-7b-codegen", "cluster=a100-ib", override, "--json")
    assert code == 1
    assert "actor_rollout_ref.rollout.n" in text


@pytest.mark.parametrize("key,real", [
    ("algorithm.kl_coef", "kl_loss_coef"),
    ("actor_rollout_ref.actor.grad_accumulation_steps", "ppo_micro_batch_size_per_gpu"),
    ("actor.grad_accumulation_steps", "ppo_micro_batch_size_per_gpu"),
    ("actor_rollout_ref.actor.seqlen_balancing", "use_dynamic_bsz"),
    ("actor_rollout_ref.actor.megatron.grad_offload", "optimizer_offload"),
    ("megatron.grad_offload", "optimizer_offload"),
    ("num_train_steps", "trainer.total_training_steps"),
    ("algorithm.adv_norm", "norm_adv_by_std_in_grpo"),
])
def test_field_report_flags_name_the_real_key(key, real) -> None:
    plan = plan_of("qwen2.5-7b-codegen", "a100-ib", f"{key}=1")
    msgs = [f"{f.message} {f.fix}" for f in errors(plan)]
    assert any(real in m for m in msgs), msgs


def test_passthrough_cannot_fight_a_modelled_field() -> None:
    plan = plan_of("qwen2.5-3b-gsm8k-lora", "a100-ib", "actor_rollout_ref.rollout.n=8")
    assert any(f.key == "passthrough.actor_rollout_ref.rollout.n" and "grpo.n" in f.fix for f in errors(plan))


@pytest.mark.parametrize("overrides,key,text", [
    (["batch.train=1023"], "batch.train", "not divisible by verl's minimal batch"),
    (["batch.mini=2048"], "batch.mini", "> train_batch_size"),
    (["batch.micro_per_gpu=48"], "batch.micro_per_gpu", "not divisible by micro batch"),
    (["batch.micro_per_gpu=null"], "batch.micro_per_gpu", "exactly one micro-batch"),
    (["parallel.rollout_tp=3"], "parallel.rollout_tp", "does not divide the 4 GPUs per node"),
    (["resources.gpus_per_node=16"], "resources.gpus_per_node", "nodes have 8"),
    (["resources.nodes=99"], "resources.nodes", "has 16"),
    (["parallel.tp=2"], "parallel.tp", "Megatron layout"),
])
def test_batch_and_layout_rules(overrides, key, text) -> None:
    plan = plan_of("qwen2.5-3b-gsm8k-lora", "a100-ib", *overrides)
    assert any(f.key == key and text in f.message for f in errors(plan)), [str(f) for f in plan.findings]


def test_megatron_layers_experts_and_etp() -> None:
    assert any("80 layers do not divide by PP 3" in f.message for f in errors(plan_of("qwen2.5-72b-megatron", "a100-ib",
                                                                                      "parallel.pp=3", "resources.nodes=3")))
    moe = plan_of("qwen3-30b-a3b-moe", "a100-ib", "parallel.ep=3")
    assert any("128 experts, not divisible by EP 3" in f.message for f in errors(moe))
    etp = plan_of("qwen3-30b-a3b-moe", "a100-ib", "parallel.etp=4")
    assert any(f.key == "parallel.etp" for f in errors(etp))
    assert not errors(plan_of("qwen3-30b-a3b-moe", "a100-ib"))


def test_memory_names_largest_term_and_knob() -> None:
    plan = plan_of("qwen2.5-72b-megatron", "a100-ib", "offload.optimizer=false", "parallel.tp=2", "parallel.pp=1",
                   "parallel.rollout_tp=8", "resources.nodes=1")
    mem = [f for f in errors(plan) if f.key.startswith("memory")]
    assert mem and plan.memory is not None and not plan.memory.fits
    assert plan.memory.largest_term in mem[0].message
    assert mem[0].fix


def test_unknown_model_shape_is_a_warning_not_a_crash() -> None:
    plan = plan_of("qwen2.5-3b-gsm8k-lora", "a100-ib", "model.path=org/UnknownModel-9B")
    assert any(f.key == "model.path" and f.severity is Severity.WARNING for f in plan.findings)
