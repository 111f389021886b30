"""`plan`'s per-GPU memory estimate of a verl GRPO step from the recipe, and which single knob would lower its peak.

The model itself (what verl keeps on a GPU in each phase) is hpc_grpo.engines.verl_memory_model; the estimate's
record and its findings are hpc_grpo.engines.memory. Nothing heavy is imported (on the path of `hpc-grpo plan`).
"""

from __future__ import annotations

import math
from dataclasses import replace

from hpc_grpo.common.findings import Finding, warning
from hpc_grpo.config.spec import RunSpec
from hpc_grpo.engines.verl_memory_model import USABLE_FRACTION, Inputs, compute
from hpc_grpo.config.layout import Layout
from hpc_grpo.config.models import ModelShape
from hpc_grpo.engines.memory import WARN_FRACTION, MemoryEstimate, memory_findings
from hpc_grpo.engines.verl_offload import CPU_OFFLOAD_KEY, FRACTION_KEY, OFFLOAD_POLICY_KEY, offload_key, read_offloads

__all__ = ["check_memory", "estimate_memory"]

VLLM_DEFAULT_MAX_NUM_SEQS = 256  # vLLM's own default for max_num_seqs

MIN_SAVING_GIB = 0.5  # advice below this is noise next to the estimate's own error


def estimate_memory(
    shape: ModelShape,
    *,
    backend: str,
    world_size: int,
    tp: int = 1,
    pp: int = 1,
    ep: int = 1,
    cp: int = 1,
    lora_rank: int = 0,
    param_offload: bool = False,
    optimizer_offload: bool = False,
    ref_param_offload: bool = True,
    use_ref: bool = True,
    gpu_memory_utilization: float = 0.5,
    gpu_memory_gb: float = 80.0,
    micro_batch_per_gpu: int = 1,
    seq_len: int = 2048,
    activation_checkpointing: bool = True,
    dtype_bytes: int = 2,
    etp: int | None = None,
    train_offload: float = 0.0,
    sequence_parallel: bool = True,
    fsdp_param_bytes: int = 4,
    rollout_tp: int | None = None,
    dynamic_bsz: bool = False,
    overhead_gib: float = 2.0,
    log_prob_micro_batch_per_gpu: int | None = None,
    enforce_eager: bool = False,
    max_num_seqs: int = VLLM_DEFAULT_MAX_NUM_SEQS,
    cpu_offload_typed: bool = False,
) -> MemoryEstimate:
    """Estimate per-GPU memory of a verl GRPO step (the model: hpc_grpo.engines.verl_memory_model).

    backend "fsdp": tp/pp/ep are ignored for training (verl's FSDP engine has none); cp is the
    Ulysses sequence-parallel size. backend "megatron": etp None = Megatron's default (= tp);
    sequence_parallel is verl's default (True). With dynamic batch size pass micro_batch_per_gpu=1
    and seq_len=ppo_max_token_len_per_gpu, and dynamic_bsz=True so advice names the right key.
    gpu_memory_gb is the card's nominal size in GiB; the usable part is USABLE_FRACTION of it. overhead_gib covers the CUDA
    context, NCCL buffers, allocator slack and what sleeping vLLM keeps. rollout_tp (vLLM's TP)
    enables the "weights fit in vLLM's share" check. log_prob_micro_batch_per_gpu (None = the
    training micro batch) sizes the log-prob phase; enforce_eager drops vLLM's CUDA-graph pool.
    train_offload is the share of the optimizer stepped on the CPU (Megatron: optimizer_offload_fraction when
    optimizer_cpu_offload is on; FSDP: 1 for FSDP2's CPUOffloadPolicy); cpu_offload_typed says Megatron's
    optimizer_cpu_offload is already set, so advice names only the fraction.
    """
    if backend not in ("fsdp", "megatron"):
        raise ValueError(f"backend must be 'fsdp' or 'megatron', not {backend!r}")
    for name, v in (("world_size", world_size), ("tp", tp), ("pp", pp), ("ep", ep), ("cp", cp)):
        if v < 1:
            raise ValueError(f"{name} must be >= 1 (got {v})")
    if micro_batch_per_gpu < 1 or seq_len < 1 or gpu_memory_gb <= 0:
        raise ValueError("micro_batch_per_gpu, seq_len and gpu_memory_gb must be positive")
    inp = Inputs(
        shape=shape,
        backend=backend,
        world_size=world_size,
        tp=tp,
        pp=pp,
        ep=ep,
        cp=cp,
        etp=etp,
        lora_rank=max(0, lora_rank),
        param_offload=param_offload,
        optimizer_offload=optimizer_offload,
        ref_param_offload=ref_param_offload,
        train_offload=train_offload,
        use_ref=use_ref,
        gpu_memory_utilization=gpu_memory_utilization,
        gpu_memory_gb=gpu_memory_gb,
        micro_batch_per_gpu=micro_batch_per_gpu,
        seq_len=seq_len,
        activation_checkpointing=activation_checkpointing,
        dtype_bytes=dtype_bytes,
        fsdp_param_bytes=fsdp_param_bytes,
        sequence_parallel=sequence_parallel,
        rollout_tp=rollout_tp,
        dynamic_bsz=dynamic_bsz,
        overhead_gib=overhead_gib,
        log_prob_micro=log_prob_micro_batch_per_gpu or micro_batch_per_gpu,
        enforce_eager=enforce_eager,
        max_num_seqs=max_num_seqs,
        cpu_offload_typed=cpu_offload_typed,
    )
    est = compute(inp)
    if est.total_gib > WARN_FRACTION * est.capacity_gib:
        est.advice = _advice(inp, est)
    return est


# ------------------------------------------------------------------------------------- advice
def _verl_key(i: Inputs, what: str) -> str:
    role = "ref" if what == "ref_param" else "actor"
    knob = "param_offload" if what in ("param", "ref_param") else "optimizer_offload"
    return f"{offload_key(i.backend, role, knob)}=True"


# Cost tiers, used to order knobs that are each enough on their own: a smaller KV cache, eager vLLM, a
# smaller micro batch, recompute and moving idle state to the CPU are cheap (in that order: what costs
# least throughput first, so gpu_memory_utilization comes before any offload); re-sharding needs a new
# layout; CPU optimizer steps and more GPUs cost time or money; LoRA changes the experiment.
_CHEAP, _LAYOUT, _COSTLY, _CHANGES_RUN = 0, 1, 2, 3
_CHEAP_ORDER = ("rollout.gpu_memory_utilization", "rollout.enforce_eager", "batch.", "model.gradient_checkpointing",
                "offload.ref_param", "offload.param", "offload.optimizer")


def _cheap_rank(label: str) -> int:
    return next((n for n, key in enumerate(_CHEAP_ORDER) if key in label), len(_CHEAP_ORDER))


def _candidates(i: Inputs, est: MemoryEstimate) -> list[tuple[str, Inputs, int]]:
    s, W = i.shape, i.world_size
    out: list[tuple[str, Inputs, int]] = []
    megatron = i.backend == "megatron"
    if i.train_offload < 1:
        if megatron and i.cpu_offload_typed:  # never suggest the flag already typed: what it lacks is the fraction
            label = (
                f"+{FRACTION_KEY}=1.0 (optimizer_cpu_offload is set, but megatron-core offloads only this fraction "
                f"of the optimizer, {i.train_offload:g} now, default 0.0; optimizer step on the CPU, slower)"
            )
        elif megatron:
            label = f"+{CPU_OFFLOAD_KEY}=True +{FRACTION_KEY}=1.0 (optimizer step on the CPU, slower)"
        else:
            label = (
                f"actor_rollout_ref.actor.strategy=fsdp2 {OFFLOAD_POLICY_KEY}=True "
                "(params/grads/optimizer on the CPU during the update, slower)"
            )
        out.append((label, replace(i, train_offload=1.0), _COSTLY))
    if not i.optimizer_offload and i.train_offload < 1:
        out.append((f"offload.optimizer=true ({_verl_key(i, 'optimizer')})", replace(i, optimizer_offload=True), _CHEAP))
    if not i.param_offload:
        out.append((f"offload.param=true ({_verl_key(i, 'param')})", replace(i, param_offload=True), _CHEAP))
    if megatron and i.use_ref and i.lora_rank == 0 and not i.ref_param_offload:
        out.append((f"offload.ref_param=true ({_verl_key(i, 'ref_param')})", replace(i, ref_param_offload=True), _CHEAP))
    if i.lora_rank == 0:
        out.append(("enable LoRA: lora.rank=64", replace(i, lora_rank=64), _CHANGES_RUN))
    if megatron:
        t2 = i.tp * 2
        if s.num_attention_heads % t2 == 0 and s.num_key_value_heads % t2 == 0 and W % (t2 * i.pp * i.cp) == 0:
            out.append((f"raise parallel.tp to {t2}", replace(i, tp=t2), _LAYOUT))
        p2 = i.pp * 2
        etp = i.etp or i.tp
        if s.num_hidden_layers % p2 == 0 and W % (i.tp * p2 * i.cp) == 0 and W % (etp * i.ep * p2) == 0:
            out.append((f"raise parallel.pp to {p2}", replace(i, pp=p2), _LAYOUT))
        e2 = i.ep * 2
        if s.is_moe and s.num_experts % e2 == 0 and W % (etp * e2 * i.pp) == 0:
            out.append((f"raise parallel.ep to {e2}", replace(i, ep=e2), _LAYOUT))
    c2 = i.cp * 2
    if W % (c2 * (i.tp * i.pp if megatron else 1)) == 0 and s.num_attention_heads % c2 == 0 and i.seq_len >= 2 * c2:
        key = "parallel.cp" if megatron else "actor_rollout_ref.actor.ulysses_sequence_parallel_size"
        out.append((f"raise {key} to {c2} (splits the sequence)", replace(i, cp=c2), _LAYOUT))
    if i.dynamic_bsz:
        if i.seq_len > 1024:
            half = i.micro_batch_per_gpu * i.seq_len // 2
            out.append((f"lower batch.max_token_len_per_gpu to {half}", replace(i, micro_batch_per_gpu=1, seq_len=half), _CHEAP))
    elif i.micro_batch_per_gpu > 1:
        m2 = i.micro_batch_per_gpu // 2
        out.append((f"lower batch.micro_per_gpu to {m2}", replace(i, micro_batch_per_gpu=m2), _CHEAP))
    if not i.activation_checkpointing:
        out.append(("model.gradient_checkpointing=true", replace(i, activation_checkpointing=True), _CHEAP))
    if not i.enforce_eager:
        out.append(("rollout.enforce_eager=true (no vLLM CUDA graphs: slower decoding)", replace(i, enforce_eager=True), _CHEAP))
    if est.peak_phase == "rollout":
        rest = est.rollout_gib - est.terms["rollout"]
        cap = i.gpu_memory_gb * USABLE_FRACTION
        target = math.floor((cap * WARN_FRACTION - rest) / cap * 20) / 20
        if 0.1 <= target < i.gpu_memory_utilization:
            out.append(
                (f"lower rollout.gpu_memory_utilization to {target:.2f} (less KV cache)", replace(i, gpu_memory_utilization=target), _CHEAP)
            )
    out.append((f"use twice the GPUs (world size {2 * W})", replace(i, world_size=2 * W), _COSTLY))
    return out


def _advice(i: Inputs, est: MemoryEstimate) -> list[str]:
    """Single knobs that lower the peak, each with its estimated saving.

    Goal: capacity when it does not fit, else the 90% line. Knobs that reach the goal alone come
    first (cheapest tier first, then biggest saving), then the rest by saving. Savings under
    MIN_SAVING_GIB are dropped as noise; knobs that would leave vLLM without a KV cache too.
    """
    cap = est.capacity_gib
    goal = cap if est.total_gib > cap else WARN_FRACTION * cap
    rows: list[tuple[bool, int, int, float, str]] = []
    for label, alt, tier in _candidates(i, est):
        new = compute(alt)
        saving = est.total_gib - new.total_gib
        if saving < MIN_SAVING_GIB or (new.rollout_kv_gib is not None and new.rollout_kv_gib < 2):
            continue
        enough = new.total_gib <= goal
        verdict = "enough on its own" if enough else "not enough alone"
        host = f"; needs ~{new.host_gib:.0f} GiB host RAM per GPU" if new.host_gib > est.host_gib + 1 else ""
        rank = _cheap_rank(label) if tier == _CHEAP else 0
        rows.append((enough, tier, rank, saving, f"{label} saves ~{saving:.1f} GiB -> ~{new.total_gib:.1f} GiB ({verdict}{host})"))
    rows.sort(key=lambda r: (not r[0], r[1] if r[0] else 0, r[2] if r[0] else 0, -r[3]))
    return [r[4] for r in rows]


# ------------------------------------------------------------------------------------ the recipe's estimate
def check_memory(spec: RunSpec, lay: Layout, shape: ModelShape | None) -> tuple[list[Finding], object | None]:
    """The recipe's estimate and its findings (plus host memory for what is offloaded); ([], None) where no GPU
    memory is modelled (trl, verl on CPU) or the model's shape is unknown."""
    r = spec.recipe
    if r.engine != "verl" or shape is None or spec.verl_cpu:  # no GPU memory to model on CPU
        return [], None
    from hpc_grpo.engines.verl import max_num_seqs

    off = read_offloads(spec)  # verl's keys as main_ppo reads them: recipe and passthrough alike
    seq = r.data.max_prompt_length + r.data.max_response_length
    micro = r.batch.micro_per_gpu or 1
    if r.batch.dynamic_bsz:
        micro, seq = 1, r.batch.max_token_len_per_gpu or seq
    est = estimate_memory(
        shape,
        backend=r.backend,
        world_size=lay.world_size,
        tp=lay.tp if r.backend == "megatron" else 1,
        pp=lay.pp if r.backend == "megatron" else 1,
        ep=lay.ep if r.backend == "megatron" else 1,
        cp=lay.cp if r.backend == "megatron" else 1,
        lora_rank=r.lora.rank,
        param_offload=off.param,
        optimizer_offload=off.optimizer,
        ref_param_offload=off.ref_param,
        train_offload=off.train_fraction,
        cpu_offload_typed=off.cpu_offload_typed,
        use_ref=r.grpo.uses_reference,
        gpu_memory_utilization=r.rollout.gpu_memory_utilization,
        gpu_memory_gb=spec.cluster.gpu_memory_gb,
        micro_batch_per_gpu=micro,
        seq_len=seq,
        activation_checkpointing=r.model.gradient_checkpointing,
        etp=r.parallel.etp if r.backend == "megatron" else None,
        rollout_tp=r.parallel.rollout_tp,
        sequence_parallel=r.parallel.sequence_parallel,
        dynamic_bsz=r.batch.dynamic_bsz,
        log_prob_micro_batch_per_gpu=r.batch.log_prob_micro_per_gpu,
        enforce_eager=r.rollout.enforce_eager,
        max_num_seqs=max_num_seqs(spec),
    )
    findings = memory_findings(est)
    if off.cpu_offload_typed and off.train_fraction == 0:
        findings.append(warning(f"passthrough.+{CPU_OFFLOAD_KEY}", "optimizer_cpu_offload=True moves nothing by itself: "
                                f"megatron-core offloads optimizer_offload_fraction of the optimizer, "
                                f"{'set to 0' if off.fraction_typed else 'default 0.0'}",
                                f"add +{FRACTION_KEY}=1.0 (the whole optimizer on the CPU), or drop the flag"))
    host_need = est.host_gib * lay.gpus_per_node
    if host_need > spec.cluster.mem_per_node_gb:
        findings.append(warning("offload", f"offloaded state needs ~{host_need:.0f} GiB of host memory per node; "
                                f"cluster '{spec.cluster.name}' nodes have {spec.cluster.mem_per_node_gb:g} GB",
                                "offload less, or use more nodes / a larger TP so each GPU holds less"))
    return findings, est

