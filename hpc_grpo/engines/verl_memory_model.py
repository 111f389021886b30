"""How one verl GRPO step uses a GPU: the per-GPU memory model behind `plan`'s memory estimate (the entry
point, with the advice on which knob lowers the peak, is hpc_grpo.engines.verl_memory).

Rough by design: good to tens of percent, not to the GiB. It ignores allocator fragmentation
beyond a fixed overhead, vocab padding and uneven pipeline stages.
Stdlib only (on the path of `hpc-grpo plan`).

How verl uses a GPU (hybrid engine: the actor, the reference and vLLM share every GPU):

* rollout phase: vLLM is awake and holds `gpu_memory_utilization x GPU memory` (weights + KV
  cache). The actor's state stays resident unless offloaded: the weights (unless param_offload),
  Megatron's persistent fp32 gradient buffer (unless param_offload, which moves grads too) and
  the optimizer states (unless optimizer_offload). FSDP frees its gradients after each step.
* training phase (update_actor): vLLM sleeps (weights offloaded/discarded, KV freed). verl loads
  an offloaded actor BACK onto the GPU for the update (`BaseEngineCtx._context_switch` in
  verl/workers/engine/base.py): `param_offload` / `optimizer_offload` only make room for vLLM,
  they do NOT lower the training peak. What does is `train_offload`: FSDP2's CPUOffloadPolicy
  (`actor.strategy=fsdp2` + `fsdp_config.offload_policy=True`: params, grads and the optimizer
  step on the CPU) or Megatron's `optimizer_cpu_offload` (megatron-core's HybridDeviceOptimizer: the fp32 master
  copy, the Adam moments and the step of `optimizer_offload_fraction` of the parameters on the CPU; the fraction
  defaults to 0.0, hpc_grpo.engines.verl_offload).
* log-prob phase (compute_log_prob, old and reference log-probs): vLLM sleeps, the actor's weights
  are loaded for a forward pass of `log_prob_micro_batch_size_per_gpu` sequences. The pinned verl keeps the
  bf16 logits plus two tensors of the same size for the entropy (6 B per token x vocabulary entry):
  for 40 x 1536 tokens at a 152k vocabulary that is ~52 GiB (bf16 logits alone ~17 GiB; they are not
  fp32), usually the largest term of an FSDP run.
* reference phase (Megatron, only when the reference is offloaded): the reference is loaded
  next to whatever actor state stays resident, for a forward pass.
* vLLM's CUDA graphs (unless `rollout.enforce_eager`): the graph pool comes on top of vLLM's
  gpu_memory_utilization share ("CUDA graphs can take additional 1~3 GiB per GPU", vLLM), the pinned verl
  captures FULL_AND_PIECEWISE graphs, and the pool cannot be freed while the actor trains
  (verl's rollout.yaml): it is resident in every phase.
* usable memory: an "80 GB" card reports ~79.15 GiB to torch and vLLM; gpu_memory_utilization is a
  fraction of that.

Activations: Megatron reads no `enable_gradient_checkpointing`; hpc-grpo renders full uniform
recompute of every layer when model.gradient_checkpointing is on, so each layer keeps only its input
(one hidden-size tensor) and the layer being recomputed holds its working set. Without recompute
every layer keeps its whole working set: several times more.

Precision (verl defaults): FSDP's actor keeps fp32 parameters (`fsdp_config.model_dtype=fp32`,
they are the master copy), fp32 grads and two fp32 Adam moments: 4 + 4 + 8 = 16 B per trainable
parameter, all sharded over the world (ZeRO-3); bf16 copies are gathered one layer at a time.
The FSDP reference is always CPU-offloaded by verl (`CPUOffload(offload_params=True)`, whatever
`ref.fsdp_config.param_offload` says). Megatron keeps bf16 weights and an fp32 gradient buffer
(`grad_reduce_in_fp32=True` in verl) sharded by TP x PP (experts by ETP x EP x PP), and the
distributed optimizer's fp32 master + 2 moments (12 B) sharded further over the data-parallel
ranks (DP x CP for dense parameters; world/(ETP x EP x PP) for experts).
LoRA: the base is frozen (no grads, no optimizer), the adapters (rank x (in+out) per linear
layer, all-linear targets incl. experts) are trained; verl then uses the base as the reference.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from hpc_grpo.config.models import ModelShape, lora_trainable_params, param_groups
from hpc_grpo.engines.memory import MemoryEstimate

GIB = float(1024**3)
MEGATRON_OPT_BYTES = 12  # fp32 master + two fp32 moments (distributed optimizer)
GRAD_BYTES = 4  # fp32 grads (FSDP fp32 params; Megatron grad_reduce_in_fp32)
LOGIT_BYTES = 6  # log-prob pass: bf16 logits + two same-size tensors for the entropy, per vocabulary entry
TRAIN_LOGIT_BYTES = 4  # update: bf16 logits + their gradient (entropy only with entropy_coeff, 0 in every recipe)
STASH_FACTOR = 1  # full recompute keeps each layer's input, one hidden-size tensor
CUDA_GRAPH_GIB = 3.0  # vLLM FULL_AND_PIECEWISE graphs at the default capture sizes (vLLM: 1~3 GiB per mode)
CUDA_GRAPH_SMALL_GIB = 1.5  # max_num_seqs <= 64: fewer, smaller captured batch sizes
USABLE_FRACTION = 79.15 / 80  # what torch reports of an "80 GB" card
VLLM_WORKSPACE_GIB = 1.0  # vLLM's profiled activation peak inside its own share


@dataclass(frozen=True)
class Inputs:
    """Everything the model reads: the model's shape, the layout, the offload switches, batch and vLLM settings."""

    shape: ModelShape
    backend: str
    world_size: int
    tp: int
    pp: int
    ep: int
    cp: int
    etp: int | None
    lora_rank: int
    param_offload: bool
    optimizer_offload: bool
    ref_param_offload: bool
    train_offload: float  # share of the optimizer stepped on the CPU, 0..1 (FSDP2's policy: 1, params and grads too)
    use_ref: bool
    gpu_memory_utilization: float
    gpu_memory_gb: float
    micro_batch_per_gpu: int
    seq_len: int
    activation_checkpointing: bool
    dtype_bytes: int
    fsdp_param_bytes: int
    sequence_parallel: bool
    rollout_tp: int | None
    dynamic_bsz: bool
    overhead_gib: float
    log_prob_micro: int
    enforce_eager: bool
    max_num_seqs: int
    cpu_offload_typed: bool = False  # Megatron's optimizer_cpu_offload already set (advice names only the fraction)


# ------------------------------------------------------------------------------------ the model
@dataclass(frozen=True)
class _Layout:
    """The parallel sizes the model uses: Megatron's as given (PP capped by the layer count), FSDP's all 1 but CP."""

    megatron: bool
    world: int
    tp: int
    pp: int
    cp: int
    etp: int
    ep: int
    layers_stage: int


@dataclass(frozen=True)
class _State:
    """The actor's (and a resident reference's) state per GPU, bytes. `layer` is one FSDP layer's parameters
    (count), `gather` FSDP's unsharded working set; both 0 on Megatron."""

    weights: float
    gradients: float
    optimizer: float
    reference: float
    gather: float = 0.0
    layer: float = 0.0


def compute(i: Inputs) -> MemoryEstimate:
    """The estimate for `i`, advice left empty (the advice runs this once more for each knob it tries)."""
    lay = _layout(i)
    full_ft = i.lora_rank == 0
    state = _megatron_state(i, lay) if lay.megatron else _fsdp_state(i)
    activations, fwd_only = _activations(i, lay.tp, lay.pp, lay.cp, lay.layers_stage, lay.megatron)
    lp_layer, lp_logits = _log_prob_activations(i, lay.tp, lay.cp)
    capacity = i.gpu_memory_gb * USABLE_FRACTION
    graphs = 0.0 if i.enforce_eager else (CUDA_GRAPH_SMALL_GIB if i.max_num_seqs <= 64 else CUDA_GRAPH_GIB) * GIB
    terms_b = {
        "weights": state.weights,
        "gradients": state.gradients,
        "optimizer": state.optimizer,
        "reference": state.reference,
        "activations": activations,
        "log_prob_logits": lp_logits,
        "fsdp_gather": state.gather,
        "rollout": i.gpu_memory_utilization * capacity * GIB,
        "cuda_graphs": graphs,
        "overhead": i.overhead_gib * GIB,
    }
    terms = {k: v / GIB for k, v in terms_b.items()}
    gather_grad = state.layer * GRAD_BYTES / GIB if (not lay.megatron and full_ft) else 0.0
    phases = _phases(i, terms, lay.megatron, fwd_only / GIB, lp_layer / GIB, gather_grad)
    sums = {k: sum(v.values()) for k, v in phases.items()}
    peak_phase = max(sums, key=lambda k: sums[k])
    total = sums[peak_phase]
    kv = _rollout_kv(i, terms["rollout"])
    return MemoryEstimate(
        notes=_layout_notes(i, lay),
        terms=terms,
        phases=phases,
        total_gib=total,
        capacity_gib=capacity,
        fits=total <= capacity and (kv is None or kv > 0),
        largest_term=max(phases[peak_phase].items(), key=lambda kv_: kv_[1])[0],
        peak_phase=peak_phase,
        host_gib=_host(i, terms, lay.megatron),
        rollout_kv_gib=kv,
    )


def _layout(i: Inputs) -> _Layout:
    """The sizes that apply to `i.backend`: TP, PP, EP and ETP mean nothing to FSDP."""
    megatron = i.backend == "megatron"
    tp = i.tp if megatron else 1
    pp = min(i.pp, i.shape.num_hidden_layers) if megatron else 1
    return _Layout(megatron=megatron, world=i.world_size, tp=tp, pp=pp, cp=i.cp,
                   etp=(i.etp or tp) if megatron else 1, ep=i.ep if megatron else 1,
                   layers_stage=math.ceil(i.shape.num_hidden_layers / pp))


def _megatron_state(i: Inputs, lay: _Layout) -> _State:
    """Megatron: a stage's layers (+ its embedding/lm_head) over TP, experts over ETP x EP; the distributed
    optimizer shards further over the data-parallel ranks; a full fine-tune's reference is a bf16 copy."""
    s, g = i.shape, param_groups(i.shape)
    full_ft = i.lora_rank == 0
    tp, pp = lay.tp, lay.pp
    layer_dense = g.attention + g.dense_mlp + g.router + g.norms - s.hidden_size
    embed_stage = g.embedding + g.lm_head if pp == 1 else max(g.embedding, g.lm_head or g.embedding)
    dense_pg = (layer_dense / pp + embed_stage) / tp
    expert_pg = g.experts / pp / (lay.etp * lay.ep)
    base_pg = dense_pg + expert_pg
    weights = base_pg * i.dtype_bytes
    dp_dense = max(1.0, lay.world / (tp * pp))  # distributed optimizer shards over DP x CP
    dp_expert = max(1.0, lay.world / (lay.etp * lay.ep * pp))
    if full_ft:
        train_pg = base_pg
        optimizer = MEGATRON_OPT_BYTES * (dense_pg / dp_dense + expert_pg / dp_expert)
    else:
        train_pg = lora_trainable_params(s, i.lora_rank) / (tp * pp)
        weights += train_pg * i.dtype_bytes
        optimizer = MEGATRON_OPT_BYTES * train_pg / dp_dense
    reference = base_pg * i.dtype_bytes if (i.use_ref and full_ft) else 0.0
    return _State(weights=weights, gradients=GRAD_BYTES * train_pg, optimizer=optimizer, reference=reference)


def _fsdp_state(i: Inputs) -> _State:
    """FSDP (ZeRO-3): fp32 params, grads and two moments sharded over the world; the reference is on the CPU.
    The unsharded working set is the root unit (embedding + lm_head) + 2 layers in flight (prefetch) in bf16,
    + one layer's unsharded fp32 grads before reduce-scatter (full fine-tuning only)."""
    s, g = i.shape, param_groups(i.shape)
    lora = lora_trainable_params(s, i.lora_rank)
    full_ft = i.lora_rank == 0
    W = i.world_size
    train = g.total if full_ft else lora
    layer = (g.total - g.embedding - g.lm_head) / s.num_hidden_layers
    gather = (g.embedding + g.lm_head + 2 * layer) * i.dtype_bytes + (layer * GRAD_BYTES if full_ft else 0)
    return _State(weights=(g.total + lora) * i.fsdp_param_bytes / W, gradients=train * i.fsdp_param_bytes / W,
                  optimizer=train * 2 * i.fsdp_param_bytes / W, reference=0.0,  # verl forces CPUOffload on it
                  gather=gather, layer=layer)


def _phases(i: Inputs, terms: dict[str, float], megatron: bool, fwd_only: float, lp_layer: float,
            gather_grad: float) -> dict[str, dict[str, float]]:
    """What sits on the GPU in each phase, GiB: an offloaded term counts 0 there (its size stays in `terms`).
    `gather_grad` is the FSDP gather's gradient part, absent from a forward-only pass."""
    cpu_share = min(1.0, max(0.0, float(i.train_offload)))
    train_off_w = cpu_share > 0 and not megatron  # FSDP2 CPUOffloadPolicy: params+grads+optimizer
    opt_gpu = terms["optimizer"] * (1.0 - cpu_share)  # Megatron's hybrid optimizer keeps the rest on the GPU
    z = 0.0
    opt_idle = z if i.optimizer_offload else opt_gpu
    ref_resident = megatron and terms["reference"] > 0 and not i.ref_param_offload
    ref = terms["reference"] if ref_resident else z
    resident_grads = terms["gradients"] if (megatron and not i.param_offload) else z
    fixed = {"cuda_graphs": terms["cuda_graphs"], "overhead": terms["overhead"]}
    training = {
        "weights": z if train_off_w else terms["weights"],
        "gradients": z if train_off_w else terms["gradients"],
        "optimizer": opt_gpu,
        "reference": ref,
        "activations": terms["activations"],
        "fsdp_gather": terms["fsdp_gather"],
        **fixed,
    }
    idle_actor = {  # actor state left on the GPU outside update_actor
        "weights": z if (i.param_offload or train_off_w) else terms["weights"],
        "gradients": resident_grads,
        "optimizer": opt_idle,
    }
    rollout = {"rollout": terms["rollout"], **idle_actor, "reference": ref, **fixed}
    log_prob = {  # the actor's weights back for a forward pass; the optimizer stays where it is
        "weights": z if train_off_w else terms["weights"],
        "gradients": resident_grads,
        "optimizer": opt_idle,
        "reference": ref,
        "activations": lp_layer,
        "log_prob_logits": terms["log_prob_logits"],
        "fsdp_gather": terms["fsdp_gather"] - gather_grad,
        **fixed,
    }
    phases = {"training": training, "rollout": rollout, "log_prob": log_prob}
    if megatron and terms["reference"] > 0 and i.ref_param_offload:
        phases["reference"] = {**idle_actor, "reference": terms["reference"], "activations": fwd_only, **fixed}
    return phases


def _host(i: Inputs, terms: dict[str, float], megatron: bool) -> float:
    """Host RAM per GPU, GiB, held by offloaded state (and by FSDP's CPU-resident reference shard)."""
    cpu_share = min(1.0, max(0.0, float(i.train_offload)))
    train_off_w = cpu_share > 0 and not megatron
    host = 0.0
    if i.param_offload or train_off_w:
        host += terms["weights"] + (terms["gradients"] if megatron or train_off_w else 0.0)
    host += terms["optimizer"] if i.optimizer_offload else terms["optimizer"] * cpu_share
    if megatron and terms["reference"] > 0 and i.ref_param_offload:
        host += terms["reference"]
    if not megatron and i.use_ref and i.lora_rank == 0:
        host += param_groups(i.shape).total * i.dtype_bytes / i.world_size / GIB
    return host


def _rollout_kv(i: Inputs, rollout_gib: float) -> float | None:
    """What vLLM's share leaves for the KV cache, GiB; None when the rollout's TP is unknown."""
    if not i.rollout_tp:
        return None
    lora = lora_trainable_params(i.shape, i.lora_rank)
    vllm_weights = (param_groups(i.shape).total + lora) * i.dtype_bytes / i.rollout_tp / GIB
    return rollout_gib - vllm_weights - VLLM_WORKSPACE_GIB


def _layout_notes(i: Inputs, lay: _Layout) -> list[str]:
    """Layouts Megatron or verl would refuse (the numbers then assume the layout as given)."""
    W, tp, pp, cp = lay.world, lay.tp, lay.pp, lay.cp
    notes: list[str] = []
    if lay.megatron:
        if W % (tp * pp * cp):
            notes.append(f"world size {W} is not divisible by tp*pp*cp = {tp * pp * cp}")
        if i.shape.is_moe and W % (lay.etp * lay.ep * pp):
            notes.append(
                f"world size {W} is not divisible by etp*ep*pp = {lay.etp}*{lay.ep}*{pp} = {lay.etp * lay.ep * pp}"
                + (" (etp defaults to tp; set parallel.etp=1)" if i.etp is None and tp > 1 else "")
            )
    elif W % cp:
        notes.append(f"world size {W} is not divisible by the Ulysses size {cp}")
    return notes


def _activations(i: Inputs, tp: int, pp: int, cp: int, layers_stage: int, megatron: bool) -> tuple[float, float]:
    """(training activations, forward-only activations) in bytes for one micro-batch.

    Checkpointing keeps ~STASH_FACTOR hidden-size tensors per layer input; backward recomputes one
    layer at a time, whose working set (q/k/v/o, norms, residual, gate/up/act/product, and their
    grads: x2) is added once. Without checkpointing every layer keeps its whole working set.
    Megatron's 1F1B keeps up to pp micro-batches in flight on the first stage; the last stage holds
    the logits and their gradient. Every sequence is taken at its full length (worst case: with
    use_remove_padding the real tokens are fewer). Splits: Megatron's sequence parallel by TP, context parallel / Ulysses by CP.
    """
    s = i.shape
    tokens = i.micro_batch_per_gpu * i.seq_len
    h, d = s.hidden_size, s.head_dim
    inter = s.num_experts_per_tok * s.moe_intermediate_size if s.is_moe else s.intermediate_size
    width = 2 * s.num_attention_heads * d + 2 * s.num_key_value_heads * d + 3 * h + 4 * inter
    in_split = cp * (tp if (megatron and i.sequence_parallel) else 1)
    work_split = cp * tp
    layer_work = tokens * width * i.dtype_bytes / work_split
    working = 2 * layer_work  # forward recompute + its gradients
    if i.activation_checkpointing:
        per_layer = tokens * h * i.dtype_bytes * STASH_FACTOR / in_split
    else:
        per_layer = layer_work + tokens * h * i.dtype_bytes / in_split
    logits = tokens * s.vocab_size * TRAIN_LOGIT_BYTES / work_split
    first = per_layer * layers_stage * pp + working  # 1F1B: pp micro-batches in flight on stage 0
    last = per_layer * layers_stage + working + logits
    train = last if pp == 1 else max(first, last)
    return train, layer_work + logits


def _log_prob_activations(i: Inputs, tp: int, cp: int) -> tuple[float, float]:
    """(one layer's forward working set, logits + entropy tensors) for one log-prob micro-batch, bytes."""
    s = i.shape
    tokens = (1 if i.dynamic_bsz else i.log_prob_micro) * i.seq_len
    h, d = s.hidden_size, s.head_dim
    inter = s.num_experts_per_tok * s.moe_intermediate_size if s.is_moe else s.intermediate_size
    width = 2 * s.num_attention_heads * d + 2 * s.num_key_value_heads * d + 3 * h + 4 * inter
    split = cp * tp
    return tokens * width * i.dtype_bytes / split, tokens * s.vocab_size * LOGIT_BYTES / split
