"""The rough per-GPU memory estimate: its structure, verl's offload semantics, known data points."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hpc_grpo.common.findings import Severity
from hpc_grpo.engines.verl_memory import estimate_memory
from hpc_grpo.config.models import ModelShape, lora_trainable_params, resolve_shape
from hpc_grpo.engines.memory import MemoryEstimate, memory_findings


def shape(name: str) -> ModelShape:
    s = resolve_shape(name)
    assert s is not None
    return s


Q3B, Q7B, Q72B, MOE = (shape(n) for n in ("Qwen2.5-3B-Instruct", "Qwen2.5-7B-Instruct", "Qwen2.5-72B-Instruct", "Qwen3-30B-A3B"))


def est(s: ModelShape = Q7B, **kw: Any) -> MemoryEstimate:
    base: dict[str, Any] = dict(
        backend="megatron",
        world_size=8,
        tp=1,
        pp=1,
        ep=1,
        cp=1,
        lora_rank=0,
        param_offload=False,
        optimizer_offload=False,
        ref_param_offload=False,
        use_ref=True,
        gpu_memory_utilization=0.6,
        gpu_memory_gb=80,
        micro_batch_per_gpu=4,
        seq_len=2048,
    )
    base.update(kw)
    return estimate_memory(s, **base)


def test_structure_and_phase_sums() -> None:
    e = est()
    assert set(e.terms) >= {"weights", "gradients", "optimizer", "reference", "activations", "rollout"}
    assert e.phase_gib()["training"] == pytest.approx(e.training_gib)
    assert e.total_gib == pytest.approx(max(e.phase_gib().values()))
    assert e.peak_phase in e.phases and e.largest_term in e.phases[e.peak_phase]
    assert e.capacity_gib == pytest.approx(79.15) and e.fits == (e.total_gib <= e.capacity_gib)  # usable of an 80 GB card
    assert e.terms["rollout"] == pytest.approx(0.6 * 79.15)
    assert "GiB" in e.summary()


def test_offloading_the_optimizer_removes_exactly_the_optimizer_term() -> None:
    # Megatron TP1: the rollout phase (vLLM share + resident actor state) is the peak
    on, off = est(), est(optimizer_offload=True)
    assert on.peak_phase == off.peak_phase == "rollout"
    assert on.total_gib - off.total_gib == pytest.approx(on.terms["optimizer"])
    assert on.rollout_gib - off.rollout_gib == pytest.approx(on.terms["optimizer"])
    assert off.host_gib == pytest.approx(on.terms["optimizer"])
    # verl loads the optimizer back for update_actor: the training phase does not shrink
    assert off.training_gib == pytest.approx(on.training_gib)


def test_train_time_offload_is_what_lowers_the_training_phase() -> None:
    on, off = est(backend="fsdp"), est(backend="fsdp", train_offload=True)
    t = on.terms
    assert on.training_gib - off.training_gib == pytest.approx(t["weights"] + t["gradients"] + t["optimizer"])
    m_on, m_off = est(), est(train_offload=True)
    assert m_on.training_gib - m_off.training_gib == pytest.approx(m_on.terms["optimizer"])


def test_param_offload_frees_the_rollout_phase_only() -> None:
    on, off = est(), est(param_offload=True)
    # Megatron's fp32 grad buffer goes to the CPU with the params
    assert on.rollout_gib - off.rollout_gib == pytest.approx(on.terms["weights"] + on.terms["gradients"])
    assert off.training_gib == pytest.approx(on.training_gib)
    f_on, f_off = est(backend="fsdp"), est(backend="fsdp", param_offload=True)
    assert f_on.rollout_gib - f_off.rollout_gib == pytest.approx(f_on.terms["weights"])  # FSDP frees grads anyway


def test_doubling_tp_on_megatron_roughly_halves_weights() -> None:
    for s in (Q7B, Q72B):
        a, b = est(s, tp=2), est(s, tp=4)
        assert b.terms["weights"] / a.terms["weights"] == pytest.approx(0.5, rel=0.05)
        assert b.terms["gradients"] / a.terms["gradients"] == pytest.approx(0.5, rel=0.05)


def test_pp_and_ep_shard_weights() -> None:
    assert est(Q72B, pp=2).terms["weights"] < 0.6 * est(Q72B).terms["weights"]
    assert est(MOE, world_size=16, ep=8).terms["weights"] < 0.6 * est(MOE, world_size=16, ep=2).terms["weights"]


def test_megatron_distributed_optimizer_shards_over_data_parallel() -> None:
    a, b = est(Q7B, world_size=8, tp=2), est(Q7B, world_size=16, tp=2)
    assert b.terms["optimizer"] == pytest.approx(a.terms["optimizer"] / 2)
    assert b.terms["weights"] == pytest.approx(a.terms["weights"])  # weights only shard by TP x PP


def test_fsdp_precision_model() -> None:
    e = est(Q7B, backend="fsdp", world_size=8)
    per_param = Q7B.params / 8 / 1024**3
    assert e.terms["weights"] == pytest.approx(4 * per_param)  # fp32 master params (verl model_dtype)
    assert e.terms["gradients"] == pytest.approx(4 * per_param)
    assert e.terms["optimizer"] == pytest.approx(8 * per_param)  # Adam m + v
    assert e.terms["reference"] == 0  # verl keeps the FSDP reference CPU-offloaded


def test_lora_removes_base_gradients_and_optimizer() -> None:
    for backend in ("fsdp", "megatron"):
        full, lora = est(Q7B, backend=backend), est(Q7B, backend=backend, lora_rank=64)
        assert lora.terms["gradients"] < 0.03 * full.terms["gradients"]
        assert lora.terms["optimizer"] < 0.03 * full.terms["optimizer"]
        assert lora.terms["weights"] >= full.terms["weights"]  # base still there, plus the adapters
        assert lora.terms["reference"] == 0  # the base is the reference
        assert lora.total_gib < full.total_gib


def test_lora_param_count_matches_peft() -> None:
    # PEFT on Qwen2.5-3B, r=64, all-linear prints "trainable params: 119,734,272 || all params: 3,205,672,960"
    assert lora_trainable_params(Q3B, 64) == 119_734_272
    assert Q3B.params + lora_trainable_params(Q3B, 64) == 3_205_672_960
    assert lora_trainable_params(Q3B, 0) == 0
    assert lora_trainable_params(MOE, 8) > 8 * 128 * 48 * 3 * (2048 + 768)  # experts are linear layers too


def test_megatron_reference_resident_unless_offloaded() -> None:
    kept, off, none = est(), est(ref_param_offload=True), est(use_ref=False)
    assert kept.phases["training"]["reference"] == pytest.approx(kept.terms["weights"])
    assert off.phases["training"]["reference"] == 0 and "reference" in off.phases
    assert none.terms["reference"] == 0 and "reference" not in none.phases


def test_72b_full_finetune_on_8x80_fsdp_does_not_fit_and_advice_names_offload() -> None:
    e = est(Q72B, backend="fsdp", world_size=8, micro_batch_per_gpu=1, seq_len=2048)
    assert not e.fits and e.total_gib > 80
    assert e.advice and any("offload" in a for a in e.advice)
    assert all("saves ~" in a for a in e.advice)
    assert "offload" in e.advice[0]
    fs = memory_findings(e)
    assert fs[0].severity is Severity.ERROR and fs[0].key == "memory"
    assert e.largest_term in fs[0].message and fs[0].fix == e.advice[0]


def test_advice_is_sorted_and_only_positive() -> None:
    e = est(Q72B, backend="megatron", world_size=8, tp=8)
    assert not e.fits
    savings = [float(a.split("saves ~")[1].split(" GiB")[0]) for a in e.advice]
    assert all(s >= 0.5 for s in savings)
    enough = ["enough on its own" in a for a in e.advice]
    assert enough == sorted(enough, reverse=True)  # knobs that fit alone come first


def test_findings_thresholds() -> None:
    ok = est(Q3B, backend="fsdp", world_size=4, gpu_memory_utilization=0.3)
    assert [f.severity for f in memory_findings(ok, key_prefix="plan.memory")] == [Severity.INFO]
    assert memory_findings(ok, key_prefix="plan.memory")[0].key == "plan.memory"
    tight = est(Q3B, backend="fsdp", world_size=4, lora_rank=64, gpu_memory_utilization=0.8)
    assert 0.9 * tight.capacity_gib < tight.total_gib <= tight.capacity_gib
    f = memory_findings(tight)[0]
    assert f.severity is Severity.WARNING and f.fix and "gpu_memory_utilization" in f.fix


def test_vllm_share_too_small_for_the_weights() -> None:
    e = est(Q72B, lora_rank=8, tp=8, rollout_tp=1, gpu_memory_utilization=0.5)
    assert e.rollout_kv_gib is not None and e.rollout_kv_gib < 0 and not e.fits
    assert any(f.key == "memory.rollout" and f.severity is Severity.ERROR for f in memory_findings(e))
    assert est(Q72B, lora_rank=8, tp=8, rollout_tp=8).rollout_kv_gib > 0


def test_invalid_expert_layout_is_noted() -> None:
    # etp defaults to tp: 4 * 4 * 2 = 32 does not divide 16 GPUs
    bad = est(MOE, world_size=16, tp=4, pp=2, ep=4)
    assert bad.notes and "etp" in bad.notes[0]
    assert any(f.key == "memory.layout" for f in memory_findings(bad))
    assert not est(MOE, world_size=16, tp=4, pp=2, ep=4, etp=1).notes


@pytest.mark.parametrize(
    "kw", [dict(backend="deepspeed"), dict(world_size=0), dict(tp=0), dict(micro_batch_per_gpu=0), dict(gpu_memory_gb=0)]
)
def test_bad_arguments_raise(kw: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        est(**kw)


# ------------------------------------------------------------------------------ properties
models = st.sampled_from([Q3B, Q7B, Q72B, MOE, shape("Qwen2.5-0.5B-Instruct"), shape("Llama-3.1-8B-Instruct")])
pow2 = st.sampled_from([1, 2, 4, 8, 16, 32, 64])


@settings(max_examples=150, deadline=None)
@given(s=models, w=pow2, lora=st.sampled_from([0, 8, 64]), micro=st.integers(1, 64), seq=st.integers(128, 16384))
def test_more_gpus_never_increase_fsdp_per_gpu_memory(s: ModelShape, w: int, lora: int, micro: int, seq: int) -> None:
    a = est(s, backend="fsdp", world_size=w, lora_rank=lora, micro_batch_per_gpu=micro, seq_len=seq)
    b = est(s, backend="fsdp", world_size=2 * w, lora_rank=lora, micro_batch_per_gpu=micro, seq_len=seq)
    for k in ("weights", "gradients", "optimizer"):
        assert b.terms[k] <= a.terms[k]
    assert b.total_gib <= a.total_gib + 1e-9


@settings(max_examples=150, deadline=None)
@given(
    s=models,
    backend=st.sampled_from(["fsdp", "megatron"]),
    tp=st.sampled_from([1, 2, 4]),
    micro=st.integers(1, 32),
    seq=st.integers(128, 8192),
    util=st.floats(0.1, 0.95),
    flags=st.tuples(st.booleans(), st.booleans(), st.booleans(), st.booleans()),
)
def test_offload_never_increases_and_batch_never_decreases(
    s: ModelShape, backend: str, tp: int, micro: int, seq: int, util: float, flags: tuple[bool, bool, bool, bool]
) -> None:
    kw: dict[str, Any] = dict(
        backend=backend, world_size=16, tp=tp, micro_batch_per_gpu=micro, seq_len=seq, gpu_memory_utilization=util
    )
    p, o, r, t = flags
    base = est(s, **kw, param_offload=p, optimizer_offload=o, ref_param_offload=r, train_offload=t)
    for knob in ("param_offload", "optimizer_offload", "ref_param_offload", "train_offload"):
        more = est(s, **{**kw, "param_offload": p, "optimizer_offload": o, "ref_param_offload": r, "train_offload": t, knob: True})
        assert more.total_gib <= base.total_gib + 1e-9
    bigger = est(s, **{**kw, "micro_batch_per_gpu": micro + 1}, param_offload=p, optimizer_offload=o, ref_param_offload=r)
    smaller = est(s, **kw, param_offload=p, optimizer_offload=o, ref_param_offload=r)
    assert bigger.terms["activations"] >= smaller.terms["activations"]
    assert base.fits == (base.total_gib <= base.capacity_gib)
    assert all(v >= 0 for ph in base.phases.values() for v in ph.values())
