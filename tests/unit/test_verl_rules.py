"""What the rendered verl call really runs, and the batch rules the pinned verl
asserts on, each at the exact value its assertion fires (read in the pinned verl's own code:
workers/engine_workers.py::train_mini_batch, utils/tensordict_utils.py::make_iterator,
workers/engine/utils.py::prepare_micro_batches, workers/engine/megatron/transformer_impl.py)."""

from __future__ import annotations

import pytest

from hpc_grpo.engines.verl import RECOMPUTE, VerlEngine
from hpc_grpo.common.findings import Severity
from hpc_grpo.planning.plan import run_plan
from hpc_grpo.config.resolve import resolve_spec
from hpc_grpo.common.yamlio import SpecError

OTC = "actor_rollout_ref.actor.megatron.override_transformer_config"


def spec_of(recipe: str, *overrides: str, cluster: str = "a100-ib"):
    return resolve_spec(recipe, cluster, ["cluster.runs_root=/nonexistent/runs", *overrides], run_name="t")


def overrides(recipe: str, *ov: str) -> dict[str, str]:
    return dict(o.split("=", 1) for o in VerlEngine().command(spec_of(recipe, *ov)).overrides)


def findings(recipe: str, *ov: str, key: str | None = None, severity: Severity = Severity.ERROR) -> list:
    plan = run_plan(spec_of(recipe, *ov), schema=False)
    return [f for f in plan.findings if f.severity is severity and (key is None or f.key == key)]


# ------------------------------------------------------------------------------------ Megatron's recompute
def test_megatron_recompute_is_rendered_as_megatron_reads_it() -> None:
    o = overrides("qwen2.5-7b-codegen")
    assert {k.rsplit(".", 1)[1]: v for k, v in o.items() if k.startswith(OTC + ".recompute")} == {
        "recompute_granularity": "full", "recompute_method": "uniform", "recompute_num_layers": "1"}
    assert "actor_rollout_ref.model.enable_gradient_checkpointing" not in o  # Megatron ignores it


def test_megatron_without_recompute_renders_none_and_the_memory_model_follows() -> None:
    o = overrides("qwen2.5-7b-codegen", "model.gradient_checkpointing=false")
    assert not [k for k in o if "recompute" in k]
    on = run_plan(spec_of("qwen2.5-7b-codegen"), schema=False).memory
    off = run_plan(spec_of("qwen2.5-7b-codegen", "model.gradient_checkpointing=false"), schema=False).memory
    assert off.terms["activations"] > 4 * on.terms["activations"]
    assert 70 < off.training_gib < 78 and on.training_gib < 50  # ~71 GiB without recompute, not 42


def test_fsdp_keeps_enable_gradient_checkpointing_and_no_megatron_keys() -> None:
    o = overrides("qwen2.5-3b-gsm8k-lora")
    assert o["actor_rollout_ref.model.enable_gradient_checkpointing"] == "True"
    assert not [k for k in o if "recompute" in k]


def test_recompute_advice_is_real_on_megatron() -> None:
    plan = run_plan(spec_of("qwen2.5-7b-codegen", "model.gradient_checkpointing=false",
                            "batch.max_token_len_per_gpu=16384"), schema=False)
    advice = plan.memory.advice
    recompute = [a for a in advice if a.startswith("model.gradient_checkpointing=true")]
    assert recompute and "enough on its own" in recompute[0]
    after = run_plan(spec_of("qwen2.5-7b-codegen", "batch.max_token_len_per_gpu=16384"), schema=False)
    assert after.memory.training_gib < plan.memory.training_gib - 20
    assert set(RECOMPUTE) <= {k.rsplit(".", 1)[1] for k in overrides("qwen2.5-7b-codegen", "batch.max_token_len_per_gpu=16384")}


def test_passthrough_recompute_is_refused_as_owned() -> None:
    plan = run_plan(spec_of("qwen2.5-7b-codegen", f"{OTC}.recompute_granularity=selective"), schema=False)
    assert any("model.gradient_checkpointing" in f.fix for f in plan.findings if f.severity is Severity.ERROR)


# ------------------------------------------------------------------------------------ rollout limits
def test_rollout_limits_are_rendered() -> None:
    o = overrides("qwen2.5-3b-gsm8k-lora")
    assert o["actor_rollout_ref.rollout.max_model_len"] == "1536"  # 512 + 1024
    assert o["actor_rollout_ref.rollout.max_num_seqs"] == "1280"  # 1024 x 5 over 4 engines (rollout TP 1)
    assert o["actor_rollout_ref.rollout.enforce_eager"] == "False"
    o72 = overrides("qwen2.5-72b-megatron")
    assert o72["actor_rollout_ref.rollout.max_num_seqs"] == "320"  # 256 x 5 over 32 / TP 8 = 4 engines
    assert o72["actor_rollout_ref.rollout.max_model_len"] == "2048"


def test_vllm_default_max_num_seqs_means_waves() -> None:
    warn = findings("qwen2.5-3b-gsm8k-lora", "rollout.max_num_seqs=256", "batch.train=256",
                    key="rollout.max_num_seqs", severity=Severity.WARNING)
    assert warn and "320 sequences per step in 2 wave(s)" in warn[0].message
    warn = findings("qwen2.5-3b-gsm8k-lora", "rollout.max_num_seqs=256", key="rollout.max_num_seqs", severity=Severity.WARNING)
    assert "1280 sequences per step in 5 wave(s)" in warn[0].message
    assert not findings("qwen2.5-3b-gsm8k-lora", key="rollout.max_num_seqs", severity=Severity.WARNING)


def test_enforce_eager_drops_the_cuda_graph_pool() -> None:
    graphs = run_plan(spec_of("qwen2.5-3b-gsm8k-lora"), schema=False).memory
    eager = run_plan(spec_of("qwen2.5-3b-gsm8k-lora", "rollout.enforce_eager=true"), schema=False).memory
    assert graphs.terms["cuda_graphs"] >= 1.5 and eager.terms["cuda_graphs"] == 0
    assert graphs.total_gib - eager.total_gib == pytest.approx(graphs.terms["cuda_graphs"])
    assert overrides("qwen2.5-3b-gsm8k-lora", "rollout.enforce_eager=true")["actor_rollout_ref.rollout.enforce_eager"] == "True"


# ------------------------------------------------------------------------------------ batch rules
def test_dynamic_bsz_still_needs_mini_times_n_divisible_by_dp() -> None:
    # 7B codegen: 8 GPUs / TP 2 = DP 4, dynamic batch size. 63 x 5 = 315, 315 % 4 = 3: train_mini_batch asserts.
    bad = findings("qwen2.5-7b-codegen", "batch.train=252", "batch.mini=63", key="batch.mini")
    assert bad and "315 is not divisible by data-parallel size 4" in bad[0].message
    assert not findings("qwen2.5-7b-codegen", "batch.train=256", "batch.mini=64", key="batch.mini")


def test_log_prob_micro_batch_must_divide_each_gpus_sequences() -> None:
    # 72B: 256 x 5 = 1280 sequences, DP 1; 1280 % 48 = 32: prepare_micro_batches asserts in compute_log_prob
    bad = findings("qwen2.5-72b-megatron", "batch.log_prob_micro_per_gpu=48", key="batch.log_prob_micro_per_gpu")
    assert bad and "1280 sequences" in bad[0].message and "48" in bad[0].message
    for ok in (40, 64):
        assert not findings("qwen2.5-72b-megatron", f"batch.log_prob_micro_per_gpu={ok}", key="batch.log_prob_micro_per_gpu")
    # 3B LoRA: 1024 x 5 over DP 4 = 1280 per GPU; 48 does not divide it, the recipe's 40 does
    assert findings("qwen2.5-3b-gsm8k-lora", "batch.log_prob_micro_per_gpu=48", key="batch.log_prob_micro_per_gpu")


def test_vpp_needs_micro_batches_divisible_by_the_group_size_not_vpp() -> None:
    # 72B PP 4, VPP 2: 64 x 5 / DP 1 = 320 per GPU; micro 32 -> 10 micro-batches: 10 % 2 == 0 (VPP) but 10 % 4 != 0
    # (microbatch_group_size_per_vp_stage defaults to PP): Megatron's engine asserts.
    bad = findings("qwen2.5-72b-megatron", "parallel.vpp=2", "batch.micro_per_gpu=32", key="batch.micro_per_gpu")
    assert bad and "10 training micro-batches" in bad[0].message and "microbatch_group_size_per_vp_stage 4" in bad[0].message
    assert not findings("qwen2.5-72b-megatron", "parallel.vpp=2", "batch.micro_per_gpu=20", key="batch.micro_per_gpu")  # 16
    # the group size set explicitly: 10 % 2 == 0 passes
    assert not findings("qwen2.5-72b-megatron", "parallel.vpp=2", "batch.micro_per_gpu=32",
                        f"+{OTC}.microbatch_group_size_per_vp_stage=2", key="batch.micro_per_gpu")
    # the log-prob pass runs through the same schedule: 1280 / 160 = 8 % 4 == 0 passes, 1280 / 128 = 10 does not
    assert findings("qwen2.5-72b-megatron", "parallel.vpp=2", "batch.log_prob_micro_per_gpu=128",
                    key="batch.log_prob_micro_per_gpu")
    assert not findings("qwen2.5-72b-megatron", "parallel.vpp=2", "batch.log_prob_micro_per_gpu=160",
                        key="batch.log_prob_micro_per_gpu")


def test_mini_batches_must_tile_the_train_batch() -> None:
    # the pinned verl does not pad: make_iterator asserts (train x n / DP) % (mini x n / DP) == 0
    bad = findings("qwen2.5-3b-gsm8k-lora", "batch.mini=384", key="batch.mini")
    assert bad and "not a multiple of ppo_mini_batch_size 384" in bad[0].message
    over = findings("qwen2.5-7b-codegen", "batch.mini=512", key="batch.mini")  # dynamic bsz skips verl's start-up check
    assert over and "512 > train_batch_size 256" in over[0].message and "dynamic" in over[0].message


def test_recipes_render_keys_verl_knows() -> None:
    from hpc_grpo.engines.verl_schema import compose_check, verl_config_dir

    folder = verl_config_dir()
    if folder is None:
        pytest.skip("verl's config files are not installed (pip install --no-deps verl hydra-core omegaconf)")
    for recipe in ("qwen2.5-7b-codegen", "qwen2.5-3b-gsm8k-lora"):
        cmd = VerlEngine().command(spec_of(recipe, "rollout.enforce_eager=true"))
        assert compose_check(cmd.config_name, cmd.overrides, folder) == []


def test_bad_max_num_seqs_is_refused() -> None:
    with pytest.raises(SpecError):
        spec_of("qwen2.5-3b-gsm8k-lora", "rollout.max_num_seqs=0")
