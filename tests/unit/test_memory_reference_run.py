"""The memory model against what a real GPU run ran and what went out of memory there, plus the terms a GPU
user meets first (log-prob logits, CUDA graphs, Megatron without recompute).

The reference GPU run of docs/benchmarks.md (Qwen2.5-3B-Instruct LoRA 64 on GSM8K, verl FSDP + vLLM, A100 80GB):
its starting script (2 GPUs,
batch 16, micro 40, rollout TP 2, gpu_memory_utilization 0.6) ran; on 4 GPUs with batch 1024 / mini 512 and
rollout TP 1 it ran at 0.7 and 0.8 (n=5 and n=10), and gpu_memory_utilization=0.9 went out of memory.
"""

from __future__ import annotations

import pytest

from hpc_grpo.common.findings import Severity
from hpc_grpo.engines.verl_memory import estimate_memory
from hpc_grpo.engines.verl_memory_model import LOGIT_BYTES
from hpc_grpo.engines.memory import memory_findings
from hpc_grpo.config.models import resolve_shape
from hpc_grpo.planning.plan import run_plan
from hpc_grpo.config.resolve import resolve_spec

Q3B = resolve_shape("Qwen2.5-3B-Instruct")
START = dict(world_size=2, micro_batch_per_gpu=40, log_prob_micro_batch_per_gpu=40, rollout_tp=2, gpu_memory_utilization=0.6)
TUNED = dict(world_size=4, micro_batch_per_gpu=16, log_prob_micro_batch_per_gpu=40, rollout_tp=1)


def ref_run(**kw):
    return estimate_memory(Q3B, backend="fsdp", lora_rank=64, seq_len=512 + 1024, gpu_memory_gb=80, **kw)


@pytest.mark.parametrize("label,kw,fits", [
    ("reference run starting script, 2 GPUs, util 0.6", START, True),
    ("reference run tuned, util 0.7", {**TUNED, "gpu_memory_utilization": 0.7}, True),
    ("reference run tuned, util 0.8 (its final run)", {**TUNED, "gpu_memory_utilization": 0.8}, True),
    ("reference run tuned, util 0.9 (reported OOM)", {**TUNED, "gpu_memory_utilization": 0.9}, False),
])
def test_the_reference_runs_table(label: str, kw: dict, fits: bool) -> None:
    e = ref_run(**kw)
    assert e.fits is fits, (label, e.summary())
    top = memory_findings(e)[0]
    assert (top.severity is Severity.ERROR) is (not fits), (label, top)
    if not fits:  # the cheapest knob that is enough comes first: the KV cache, not an offload
        assert "gpu_memory_utilization" in e.advice[0], e.advice
        assert e.peak_phase == "rollout"


def test_the_shipped_3b_recipe_is_the_reference_runs_final_setup() -> None:
    plan = run_plan(resolve_spec("qwen2.5-3b-gsm8k-lora", "a100-ib", ["cluster.runs_root=/nonexistent/r"], run_name="t"),
                    schema=False)
    assert plan.memory.fits
    oom = run_plan(resolve_spec("qwen2.5-3b-gsm8k-lora", "a100-ib", ["cluster.runs_root=/nonexistent/r",
                                                                     "rollout.gpu_memory_utilization=0.9"], run_name="t"),
                   schema=False)
    assert not oom.memory.fits and not oom.ok


def test_log_prob_logits_are_bf16_plus_two_entropy_tensors() -> None:
    # "fp32 logits, about 17 GiB for 40 x 1536 at a 152k vocabulary", as often said: 17 GiB is the bf16 size.
    bf16 = 40 * 1536 * Q3B.vocab_size * 2 / 2**30
    assert bf16 == pytest.approx(17.4, abs=0.1)
    e = ref_run(**{**TUNED, "gpu_memory_utilization": 0.8})
    assert LOGIT_BYTES == 6
    assert e.terms["log_prob_logits"] == pytest.approx(3 * bf16)
    assert e.phases["log_prob"]["log_prob_logits"] == e.terms["log_prob_logits"]
    assert "log_prob_logits" not in e.phases["rollout"]  # vLLM is awake only when log-probs are not computed
    smaller = ref_run(**{**TUNED, "gpu_memory_utilization": 0.8, "log_prob_micro_batch_per_gpu": 8})
    assert smaller.phase_gib()["log_prob"] < e.phase_gib()["log_prob"] - 30


def test_cuda_graph_pool_is_resident_in_every_phase() -> None:
    e = ref_run(**{**TUNED, "gpu_memory_utilization": 0.8})
    assert all(ph["cuda_graphs"] == e.terms["cuda_graphs"] > 0 for ph in e.phases.values())
    eager = ref_run(**{**TUNED, "gpu_memory_utilization": 0.9}, enforce_eager=True)
    assert eager.total_gib < ref_run(**{**TUNED, "gpu_memory_utilization": 0.9}).total_gib


def test_recompute_keeps_one_hidden_tensor_per_layer() -> None:
    # no stash double count: with full uniform recompute each layer keeps exactly its input (bf16 hidden)
    s7 = resolve_shape("Qwen2.5-7B-Instruct")
    kw = dict(backend="megatron", world_size=8, tp=2, micro_batch_per_gpu=1, seq_len=12288, dynamic_bsz=True)
    a = estimate_memory(s7, **kw, activation_checkpointing=True)
    b = estimate_memory(s7, **{**kw, "seq_len": 2 * 12288}, activation_checkpointing=True)
    per_layer_input = 12288 * s7.hidden_size * 2 / 2 / 2**30  # sequence parallel over TP 2
    growth = b.terms["activations"] - a.terms["activations"]
    stash = per_layer_input * s7.num_hidden_layers
    assert growth > stash and growth < stash + a.terms["activations"]  # the stash scales once, not twice
    off = estimate_memory(s7, **kw, activation_checkpointing=False)
    assert off.terms["activations"] > 4 * a.terms["activations"]
