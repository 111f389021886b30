"""A ROUGH per-GPU memory estimate for one verl GRPO step, so `plan` can say "will not fit" and
which knob would fix it before a job waits hours in the queue to OOM.

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
  step on the CPU) or Megatron's `optimizer_cpu_offload` (optimizer states and step on the CPU).
* log-prob phase (compute_log_prob, old and reference log-probs): vLLM sleeps, the actor's weights
  are loaded for a forward pass of `log_prob_micro_batch_size_per_gpu` sequences. verl 0.9.1 keeps the
  bf16 logits plus two tensors of the same size for the entropy (6 B per token x vocabulary entry):
  for 40 x 1536 tokens at a 152k vocabulary that is ~52 GiB (bf16 logits alone ~17 GiB; they are not
  fp32), usually the largest term of an FSDP run.
* reference phase (Megatron, only when the reference is offloaded): the reference is loaded
  next to whatever actor state stays resident, for a forward pass.
* vLLM's CUDA graphs (unless `rollout.enforce_eager`): the graph pool comes on top of vLLM's
  gpu_memory_utilization share ("CUDA graphs can take additional 1~3 GiB per GPU", vLLM), verl 0.9.1
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
from dataclasses import dataclass, field, replace

from hpc_grpo.common.findings import Finding, error, info, warning
from hpc_grpo.planning.models import ModelShape, param_groups

__all__ = ["MemoryEstimate", "estimate_memory", "lora_trainable_params", "memory_findings"]

GIB = float(1024**3)
WARN_FRACTION = 0.9
ADAM_STATES_BYTES = 8  # two moments; FSDP: in the fp32 param dtype, the params are the master
MEGATRON_OPT_BYTES = 12  # fp32 master + two fp32 moments (distributed optimizer)
GRAD_BYTES = 4  # fp32 grads (FSDP fp32 params; Megatron grad_reduce_in_fp32)
LOGIT_BYTES = 6  # log-prob pass: bf16 logits + two same-size tensors for the entropy, per vocabulary entry
TRAIN_LOGIT_BYTES = 4  # update: bf16 logits + their gradient (entropy only with entropy_coeff, 0 in every recipe)
STASH_FACTOR = 1  # full recompute keeps each layer's input, one hidden-size tensor
CUDA_GRAPH_GIB = 3.0  # vLLM FULL_AND_PIECEWISE graphs at the default capture sizes (vLLM: 1~3 GiB per mode)
CUDA_GRAPH_SMALL_GIB = 1.5  # max_num_seqs <= 64: fewer, smaller captured batch sizes
USABLE_FRACTION = 79.15 / 80  # what torch reports of an "80 GB" card
VLLM_WORKSPACE_GIB = 1.0  # vLLM's profiled activation peak inside its own share
MIN_SAVING_GIB = 0.5  # advice below this is noise next to the estimate's own error


def lora_trainable_params(shape: ModelShape, rank: int) -> int:
    """Adapter parameters for LoRA on all linear layers: rank x (in + out) per linear layer.

    Counts q/k/v/o, gate/up/down of dense MLPs and of every expert, and the MoE router; PEFT's
    all-linear leaves the lm_head out.
    """
    if rank <= 0:
        return 0
    h, d = shape.hidden_size, shape.head_dim
    q, kv = shape.num_attention_heads * d, shape.num_key_value_heads * d
    attn = (h + q) + 2 * (h + kv) + (q + h)
    dense_layers = shape.num_hidden_layers - shape.num_moe_layers
    per_dense = 3 * (h + shape.intermediate_size)
    per_moe = shape.num_experts * 3 * (h + shape.moe_intermediate_size) + (h + shape.num_experts)
    return rank * (attn * shape.num_hidden_layers + per_dense * dense_layers + per_moe * shape.num_moe_layers)


@dataclass
class MemoryEstimate:
    """Per-GPU memory of one GRPO step, in GiB.

    `terms` are the sizes of each piece WHEN ON THE GPU (an offloaded term keeps its size here so the
    saving is visible); `phases` say what is resident in each phase (offloaded = 0). total_gib is the
    worst phase. `host_gib` is host RAM per GPU held by offloaded state (x GPUs per node for a node).
    `rollout_kv_gib` is what vLLM's share leaves for the KV cache (None when rollout_tp is unknown);
    `fits` needs the peak within capacity AND room for a KV cache. `notes` flag layouts Megatron
    or verl would refuse (the numbers then assume the layout as given).
    """

    terms: dict[str, float]
    phases: dict[str, dict[str, float]]
    total_gib: float
    capacity_gib: float
    fits: bool
    largest_term: str
    peak_phase: str
    advice: list[str] = field(default_factory=list)
    host_gib: float = 0.0
    rollout_kv_gib: float | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def training_gib(self) -> float:
        return sum(self.phases["training"].values())

    @property
    def rollout_gib(self) -> float:
        return sum(self.phases["rollout"].values())

    @property
    def fraction(self) -> float:
        return self.total_gib / self.capacity_gib if self.capacity_gib > 0 else math.inf

    def phase_gib(self) -> dict[str, float]:
        return {k: sum(v.values()) for k, v in self.phases.items()}

    def summary(self) -> str:
        phases = ", ".join(f"{k} {v:.1f}" for k, v in self.phase_gib().items())
        return (
            f"~{self.total_gib:.1f} of {self.capacity_gib:.0f} GiB per GPU ({self.fraction:.0%}; {phases}); "
            f"peak in the {self.peak_phase} phase, largest term {self.largest_term} "
            f"{self.phases[self.peak_phase].get(self.largest_term, 0.0):.1f} GiB"
        )


@dataclass(frozen=True)
class _In:
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
    train_offload: bool
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
    train_offload: bool = False,
    sequence_parallel: bool = True,
    fsdp_param_bytes: int = 4,
    rollout_tp: int | None = None,
    dynamic_bsz: bool = False,
    overhead_gib: float = 2.0,
    log_prob_micro_batch_per_gpu: int | None = None,
    enforce_eager: bool = False,
    max_num_seqs: int = 256,
) -> MemoryEstimate:
    """Estimate per-GPU memory of a verl GRPO step (see the module docstring for the model).

    backend "fsdp": tp/pp/ep are ignored for training (verl's FSDP engine has none); cp is the
    Ulysses sequence-parallel size. backend "megatron": etp None = Megatron's default (= tp);
    sequence_parallel is verl's default (True). With dynamic batch size pass micro_batch_per_gpu=1
    and seq_len=ppo_max_token_len_per_gpu, and dynamic_bsz=True so advice names the right key.
    gpu_memory_gb is the card's nominal size in GiB; the usable part is USABLE_FRACTION of it. overhead_gib covers the CUDA
    context, NCCL buffers, allocator slack and what sleeping vLLM keeps. rollout_tp (vLLM's TP)
    enables the "weights fit in vLLM's share" check. log_prob_micro_batch_per_gpu (None = the
    training micro batch) sizes the log-prob phase; enforce_eager drops vLLM's CUDA-graph pool.
    """
    if backend not in ("fsdp", "megatron"):
        raise ValueError(f"backend must be 'fsdp' or 'megatron', not {backend!r}")
    for name, v in (("world_size", world_size), ("tp", tp), ("pp", pp), ("ep", ep), ("cp", cp)):
        if v < 1:
            raise ValueError(f"{name} must be >= 1 (got {v})")
    if micro_batch_per_gpu < 1 or seq_len < 1 or gpu_memory_gb <= 0:
        raise ValueError("micro_batch_per_gpu, seq_len and gpu_memory_gb must be positive")
    inp = _In(
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
    )
    est = _compute(inp)
    if est.total_gib > WARN_FRACTION * est.capacity_gib:
        est.advice = _advice(inp, est)
    return est


# ------------------------------------------------------------------------------------ the model
def _compute(i: _In) -> MemoryEstimate:
    s = i.shape
    g = param_groups(s)
    lora = lora_trainable_params(s, i.lora_rank)
    full_ft = i.lora_rank == 0
    W = i.world_size
    megatron = i.backend == "megatron"
    tp = i.tp if megatron else 1
    pp = min(i.pp, s.num_hidden_layers) if megatron else 1
    cp = i.cp
    etp = (i.etp or tp) if megatron else 1
    ep = i.ep if megatron else 1
    layers_stage = math.ceil(s.num_hidden_layers / pp)

    if megatron:
        # per-GPU parameter share: a stage's layers (+ its embedding/lm_head) over TP; experts over ETP x EP
        layer_dense = g.attention + g.dense_mlp + g.router + g.norms - s.hidden_size
        embed_stage = g.embedding + g.lm_head if pp == 1 else max(g.embedding, g.lm_head or g.embedding)
        dense_pg = (layer_dense / pp + embed_stage) / tp
        expert_pg = g.experts / pp / (etp * ep)
        base_pg = dense_pg + expert_pg
        weights = base_pg * i.dtype_bytes
        dp_dense = max(1.0, W / (tp * pp))  # distributed optimizer shards over DP x CP
        dp_expert = max(1.0, W / (etp * ep * pp))
        if full_ft:
            train_pg = base_pg
            optimizer = MEGATRON_OPT_BYTES * (dense_pg / dp_dense + expert_pg / dp_expert)
        else:
            train_pg = lora / (tp * pp)
            weights += train_pg * i.dtype_bytes
            optimizer = MEGATRON_OPT_BYTES * train_pg / dp_dense
        gradients = GRAD_BYTES * train_pg
        reference = base_pg * i.dtype_bytes if (i.use_ref and full_ft) else 0.0
        gather = 0.0
        layer = 0.0
    else:
        weights = (g.total + lora) * i.fsdp_param_bytes / W
        train = g.total if full_ft else lora
        gradients = train * i.fsdp_param_bytes / W
        optimizer = train * 2 * i.fsdp_param_bytes / W
        reference = 0.0  # verl forces CPUOffload on the FSDP reference
        # unsharded working set: root unit (embedding + lm_head) + 2 layers in flight (prefetch) in bf16,
        # + one layer's unsharded fp32 grads before reduce-scatter (full fine-tuning only)
        layer = (g.total - g.embedding - g.lm_head) / s.num_hidden_layers
        gather = (g.embedding + g.lm_head + 2 * layer) * i.dtype_bytes + (layer * GRAD_BYTES if full_ft else 0)

    activations, fwd_only = _activations(i, tp, pp, cp, layers_stage, megatron)
    lp_layer, lp_logits = _log_prob_activations(i, tp, cp)
    capacity = i.gpu_memory_gb * USABLE_FRACTION
    rollout_share = i.gpu_memory_utilization * capacity * GIB
    overhead = i.overhead_gib * GIB
    graphs = 0.0 if i.enforce_eager else (CUDA_GRAPH_SMALL_GIB if i.max_num_seqs <= 64 else CUDA_GRAPH_GIB) * GIB

    terms_b = {
        "weights": weights,
        "gradients": gradients,
        "optimizer": optimizer,
        "reference": reference,
        "activations": activations,
        "log_prob_logits": lp_logits,
        "fsdp_gather": gather,
        "rollout": rollout_share,
        "cuda_graphs": graphs,
        "overhead": overhead,
    }
    terms = {k: v / GIB for k, v in terms_b.items()}

    # what sits where, per phase
    train_off_w = i.train_offload and not megatron  # FSDP2 CPUOffloadPolicy: params+grads+optimizer
    train_off_opt = i.train_offload  # both backends: optimizer on the CPU
    ref_resident = megatron and reference > 0 and not i.ref_param_offload
    z = 0.0
    training = {
        "weights": z if train_off_w else terms["weights"],
        "gradients": z if train_off_w else terms["gradients"],
        "optimizer": z if train_off_opt else terms["optimizer"],
        "reference": terms["reference"] if ref_resident else z,
        "activations": terms["activations"],
        "fsdp_gather": terms["fsdp_gather"],
        "cuda_graphs": terms["cuda_graphs"],
        "overhead": terms["overhead"],
    }
    idle_actor = {  # actor state left on the GPU outside update_actor
        "weights": z if (i.param_offload or train_off_w) else terms["weights"],
        "gradients": terms["gradients"] if (megatron and not i.param_offload) else z,
        "optimizer": z if (i.optimizer_offload or train_off_opt) else terms["optimizer"],
    }
    rollout = {
        "rollout": terms["rollout"],
        **idle_actor,
        "reference": terms["reference"] if ref_resident else z,
        "cuda_graphs": terms["cuda_graphs"],
        "overhead": terms["overhead"],
    }
    log_prob = {  # the actor's weights back for a forward pass; the optimizer stays where it is
        "weights": z if train_off_w else terms["weights"],
        "gradients": terms["gradients"] if (megatron and not i.param_offload) else z,
        "optimizer": z if (i.optimizer_offload or train_off_opt) else terms["optimizer"],
        "reference": terms["reference"] if ref_resident else z,
        "activations": lp_layer / GIB,
        "log_prob_logits": terms["log_prob_logits"],
        "fsdp_gather": terms["fsdp_gather"] - (layer * GRAD_BYTES / GIB if (not megatron and full_ft) else 0.0),
        "cuda_graphs": terms["cuda_graphs"],
        "overhead": terms["overhead"],
    }
    phases = {"training": training, "rollout": rollout, "log_prob": log_prob}
    if megatron and reference > 0 and i.ref_param_offload:
        phases["reference"] = {
            **idle_actor,
            "reference": terms["reference"],
            "activations": fwd_only / GIB,
            "cuda_graphs": terms["cuda_graphs"],
            "overhead": terms["overhead"],
        }

    sums = {k: sum(v.values()) for k, v in phases.items()}
    peak_phase = max(sums, key=lambda k: sums[k])
    total = sums[peak_phase]
    largest = max(phases[peak_phase].items(), key=lambda kv: kv[1])[0]

    host = 0.0
    if i.param_offload or train_off_w:
        host += terms["weights"] + (terms["gradients"] if megatron or train_off_w else 0.0)
    if i.optimizer_offload or train_off_opt:
        host += terms["optimizer"]
    if megatron and reference > 0 and i.ref_param_offload:
        host += terms["reference"]
    if not megatron and i.use_ref and full_ft:
        host += g.total * i.dtype_bytes / W / GIB  # the CPU-resident FSDP reference shard

    kv = None
    if i.rollout_tp:
        vllm_weights = (g.total + lora) * i.dtype_bytes / i.rollout_tp / GIB
        kv = terms["rollout"] - vllm_weights - VLLM_WORKSPACE_GIB

    notes: list[str] = []
    if megatron:
        if W % (tp * pp * cp):
            notes.append(f"world size {W} is not divisible by tp*pp*cp = {tp * pp * cp}")
        if s.is_moe and W % (etp * ep * pp):
            notes.append(
                f"world size {W} is not divisible by etp*ep*pp = {etp}*{ep}*{pp} = {etp * ep * pp}"
                + (" (etp defaults to tp; set parallel.etp=1)" if i.etp is None and tp > 1 else "")
            )
    elif W % cp:
        notes.append(f"world size {W} is not divisible by the Ulysses size {cp}")

    return MemoryEstimate(
        notes=notes,
        terms=terms,
        phases=phases,
        total_gib=total,
        capacity_gib=capacity,
        fits=total <= capacity and (kv is None or kv > 0),
        largest_term=largest,
        peak_phase=peak_phase,
        host_gib=host,
        rollout_kv_gib=kv,
    )


def _activations(i: _In, tp: int, pp: int, cp: int, layers_stage: int, megatron: bool) -> tuple[float, float]:
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


def _log_prob_activations(i: _In, tp: int, cp: int) -> tuple[float, float]:
    """(one layer's forward working set, logits + entropy tensors) for one log-prob micro-batch, bytes."""
    s = i.shape
    tokens = (1 if i.dynamic_bsz else i.log_prob_micro) * i.seq_len
    h, d = s.hidden_size, s.head_dim
    inter = s.num_experts_per_tok * s.moe_intermediate_size if s.is_moe else s.intermediate_size
    width = 2 * s.num_attention_heads * d + 2 * s.num_key_value_heads * d + 3 * h + 4 * inter
    split = cp * tp
    return tokens * width * i.dtype_bytes / split, tokens * s.vocab_size * LOGIT_BYTES / split


# ------------------------------------------------------------------------------------- advice
def _verl_key(i: _In, what: str) -> str:
    eng = "megatron" if i.backend == "megatron" else "fsdp_config"
    role = "ref" if what == "ref_param" else "actor"
    knob = "param_offload" if what in ("param", "ref_param") else "optimizer_offload"
    return f"actor_rollout_ref.{role}.{eng}.{knob}=True"


# Cost tiers, used to order knobs that are each enough on their own: a smaller KV cache, eager vLLM, a
# smaller micro batch, recompute and moving idle state to the CPU are cheap (in that order: what costs
# least throughput first, so gpu_memory_utilization comes before any offload); re-sharding needs a new
# layout; CPU optimizer steps and more GPUs cost time or money; LoRA changes the experiment.
_CHEAP, _LAYOUT, _COSTLY, _CHANGES_RUN = 0, 1, 2, 3
_CHEAP_ORDER = ("rollout.gpu_memory_utilization", "rollout.enforce_eager", "batch.", "model.gradient_checkpointing",
                "offload.ref_param", "offload.param", "offload.optimizer")


def _cheap_rank(label: str) -> int:
    return next((n for n, key in enumerate(_CHEAP_ORDER) if key in label), len(_CHEAP_ORDER))


def _candidates(i: _In, est: MemoryEstimate) -> list[tuple[str, _In, int]]:
    s, W = i.shape, i.world_size
    out: list[tuple[str, _In, int]] = []
    megatron = i.backend == "megatron"
    if not i.train_offload:
        if megatron:
            label = (
                "+actor_rollout_ref.actor.optim.override_optimizer_config.optimizer_cpu_offload=True "
                "(+ optimizer_offload_fraction=1.0; optimizer step on the CPU, slower)"
            )
        else:
            label = (
                "actor_rollout_ref.actor.strategy=fsdp2 + actor_rollout_ref.actor.fsdp_config.offload_policy=True "
                "(params/grads/optimizer on the CPU during the update, slower)"
            )
        out.append((label, replace(i, train_offload=True), _COSTLY))
    if not i.optimizer_offload and not i.train_offload:
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


def _advice(i: _In, est: MemoryEstimate) -> list[str]:
    """Single knobs that lower the peak, each with its estimated saving.

    Goal: capacity when it does not fit, else the 90% line. Knobs that reach the goal alone come
    first (cheapest tier first, then biggest saving), then the rest by saving. Savings under
    MIN_SAVING_GIB are dropped as noise; knobs that would leave vLLM without a KV cache too.
    """
    cap = est.capacity_gib
    goal = cap if est.total_gib > cap else WARN_FRACTION * cap
    rows: list[tuple[bool, int, int, float, str]] = []
    for label, alt, tier in _candidates(i, est):
        new = _compute(alt)
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


# ------------------------------------------------------------------------------------ findings
def memory_findings(est: MemoryEstimate, key_prefix: str = "memory") -> list[Finding]:
    """Error when it does not fit (largest term + the top knob), warning above 90%, else info."""
    out: list[Finding] = []
    peak_val = est.phases[est.peak_phase].get(est.largest_term, 0.0)
    what = (
        f"estimated peak ~{est.total_gib:.1f} GiB per GPU in the {est.peak_phase} phase "
        f"({est.fraction:.0%} of {est.capacity_gib:.0f} GiB); largest term: {est.largest_term} ~{peak_val:.1f} GiB"
    )
    top = est.advice[0] if est.advice else ""
    if est.total_gib > est.capacity_gib:
        out.append(error(key_prefix, f"does not fit: {what}", top or "use more GPUs or a smaller model"))
    elif est.total_gib > WARN_FRACTION * est.capacity_gib:
        out.append(warning(key_prefix, f"tight (rough estimate, OOM likely): {what}", top))
    else:
        out.append(info(key_prefix, f"within GPU memory (rough estimate): {what}"))
    for note in est.notes:
        out.append(warning(f"{key_prefix}.layout", f"memory estimate assumes an invalid layout: {note}"))
    if est.rollout_kv_gib is not None:
        if est.rollout_kv_gib <= 0:
            out.append(
                error(
                    f"{key_prefix}.rollout",
                    f"vLLM's share ({est.terms['rollout']:.1f} GiB) cannot hold the model weights and a KV cache",
                    "raise rollout.gpu_memory_utilization or parallel.rollout_tp",
                )
            )
        elif est.rollout_kv_gib < 2:
            out.append(
                warning(
                    f"{key_prefix}.rollout",
                    f"vLLM's share leaves only ~{est.rollout_kv_gib:.1f} GiB for the KV cache: slow rollouts",
                    "raise rollout.gpu_memory_utilization or parallel.rollout_tp",
                )
            )
    return out
