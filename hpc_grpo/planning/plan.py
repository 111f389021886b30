"""Every pre-submit check. Each is a small function RunSpec -> findings.

The batch rules mirror verl's own start-up checks (verl/utils/config.py::validate_config) so a
job that would die in its first minute on the cluster dies here instead, with the key and fix.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from hpc_grpo.engines import get_engine
from hpc_grpo.common.findings import Finding, cannot_read, error, has_errors, info, warning
from hpc_grpo.planning.models import ModelShape, resolve_shape
from hpc_grpo.planning.resources import Layout, check_resources, layout_of
from hpc_grpo.common.yamlio import SpecError
from hpc_grpo.config.spec import RunSpec


@dataclass
class Plan:
    spec: RunSpec
    layout: Layout
    shape: ModelShape | None
    findings: list[Finding] = field(default_factory=list)
    memory: object | None = None
    schedule: object | None = None
    schema_checked: str = "skipped"
    code_isolation: str | None = None  # what the code sandbox gets on the compute nodes (code recipes only)

    @property
    def ok(self) -> bool:
        return not has_errors(self.findings)


# --------------------------------------------------------------------------------------- layout
ADVICE = (  # field report 000's table: advice, never a rule
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
    if lay.world_size and lay.world_size % p.rollout_tp:
        out.append(error("parallel.rollout_tp", f"rollout world size {lay.world_size} is not divisible by rollout TP {p.rollout_tp}",
                         "choose parallel.rollout_tp dividing the GPU count"))
    if lay.gpus_per_node and lay.gpus_per_node % p.rollout_tp:
        out.append(error("parallel.rollout_tp", f"rollout TP {p.rollout_tp} does not divide the {lay.gpus_per_node} GPUs per node",
                         "choose parallel.rollout_tp dividing resources.gpus_per_node"))
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
    rtp = p.rollout_tp
    if heads % rtp or (kv % rtp and rtp % kv):
        out.append(error("parallel.rollout_tp", f"vLLM cannot split {heads} heads / {kv} KV heads over rollout TP {rtp}",
                         f"use a rollout TP dividing {heads} (and {kv}, or a multiple of it)"))
    if r.backend == "megatron":
        stages = p.pp * (p.vpp or 1)
        if shape.num_hidden_layers % stages:
            out.append(error("parallel.pp", f"{shape.name} has {shape.num_hidden_layers} layers, not divisible by PP x VPP = {stages}",
                             f"use a PP (x VPP) dividing {shape.num_hidden_layers}"))
        if p.ep > 1 and not shape.num_experts:
            out.append(error("parallel.ep", f"{shape.name} is a dense model: expert parallel {p.ep} has nothing to split",
                             "use parallel.ep=1"))
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
            out.append(info("parallel", f"field report 000 advises TP {advised[0]}, PP {advised[1]}"
                            + (f", EP {advised[2]}" if shape.num_experts else "") + f" for {label} models; this recipe uses "
                            f"TP {p.tp}, PP {p.pp}" + (f", EP {p.ep}" if shape.num_experts else ""), "advice only"))
    return out


# -------------------------------------------------------------------------------------- batches
VPP_GROUP_KEY = "actor_rollout_ref.actor.megatron.override_transformer_config.microbatch_group_size_per_vp_stage"


def vpp_group_size(spec: RunSpec) -> int:
    """Megatron's microbatch_group_size_per_vp_stage: a passthrough setting, else its default, PP."""
    for key, value in spec.recipe.passthrough.items():
        if key.lstrip("+") == VPP_GROUP_KEY and isinstance(value, int) and value > 0:
            return value
    return spec.recipe.parallel.pp


def check_batches(spec: RunSpec, lay: Layout) -> list[Finding]:
    """verl 0.9.1's batch arithmetic, restated with the recipe's keys.

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
                         "verl 0.9.1 does not pad the last mini-batch, make_iterator asserts on the first update",
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


# ----------------------------------------------------------------------------------- memory/disk
def check_memory(spec: RunSpec, lay: Layout, shape: ModelShape | None) -> tuple[list[Finding], object | None]:
    r = spec.recipe
    if r.engine != "verl" or shape is None or spec.verl_cpu:  # no GPU memory to model on CPU
        return [], None
    from hpc_grpo.engines.verl import max_num_seqs
    from hpc_grpo.planning.memory import estimate_memory, memory_findings

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
        param_offload=r.offload.param,
        optimizer_offload=r.offload.optimizer,
        ref_param_offload=r.offload.ref_param,
        use_ref=r.grpo.kl_loss,
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
    host_need = est.host_gib * lay.gpus_per_node
    if host_need > spec.cluster.mem_per_node_gb:
        findings.append(warning("offload", f"offloaded state needs ~{host_need:.0f} GiB of host memory per node; "
                                f"cluster '{spec.cluster.name}' nodes have {spec.cluster.mem_per_node_gb:g} GB",
                                "offload less, or use more nodes / a larger TP so each GPU holds less"))
    return findings, est


# ------------------------------------------------------------------------------------ misc/env
def check_environment(spec: RunSpec, for_submit: bool) -> list[Finding]:
    r = spec.recipe
    out: list[Finding] = []
    if "wandb" in r.logging.logger and os.environ.get("WANDB_MODE") not in ("offline", "disabled"):
        netrc = Path.home() / ".netrc"
        try:
            has_key = bool(os.environ.get("WANDB_API_KEY")) or (netrc.exists() and "api.wandb.ai" in netrc.read_text(errors="ignore"))
        except OSError as exc:
            out.append((error if for_submit else warning)("logging.logger", f"W&B credentials: {cannot_read(netrc, exc)}",
                                                          "`chmod 600 ~/.netrc` (it must be yours), or export WANDB_API_KEY"))
            return out
        if not has_key:
            make = error if for_submit else warning
            out.append(make("logging.logger", "W&B is on but no credentials were found (WANDB_API_KEY or ~/.netrc): "
                            "the job would fail minutes in", "run `wandb login`, export WANDB_MODE=offline, or drop wandb"))
    return out  # data files, model, runs root and Slurm: preflight.py


def check_eval(spec: RunSpec, for_submit: bool) -> list[Finding]:
    """The chained evaluation must be able to run: found now, not after hours of training."""
    e = spec.recipe.eval
    if not e.enabled:
        return []
    from hpc_grpo.evaluation.evaluate import data_files, eval_resources, needs_gsm8k

    out: list[Finding] = []
    try:
        gpus = eval_resources(spec).gpus
        if e.resources.gpus_per_node is not None and gpus > spec.cluster.gpus_per_node:  # else: the training's
            out.append(error("eval.resources.gpus_per_node", f"the eval job asks for {gpus} GPUs on one node; "
                             f"cluster {spec.cluster.name} nodes have {spec.cluster.gpus_per_node}",
                             f"set eval.resources.gpus_per_node<={spec.cluster.gpus_per_node}"))
    except SpecError as exc:  # the message names the key, the value and the fix
        out.append(error(exc.key, str(exc)))
    if e.resources.time_min > spec.cluster.time_max_min:
        out.append(error("eval.resources.time", f"{e.resources.time} is over the cluster's limit {spec.cluster.time_max}",
                         "lower eval.resources.time or eval.limit"))
    try:
        if needs_gsm8k(e.tasks):
            data_files(spec)
    except SpecError as exc:
        out.append((error if for_submit else warning)(exc.key or "eval.test_file", str(exc),
                                                      "or set eval.enabled=false"))
    return out


def runs_policy_code(spec: RunSpec) -> bool:
    """The run executes model-written code: the execution reward, or a HumanEval evaluation."""
    e = spec.recipe.eval
    return spec.recipe.grpo.reward == "code_exec" or (e.enabled and "humaneval" in e.tasks)


def nodes_are_this_machine(spec: RunSpec) -> bool:
    """The jobs run on this machine: cluster=local, or a Slurm this machine talks to whose nodes all have a
    loopback or this host's address (slurm-dev). Then a probe here answers for the compute nodes."""
    if spec.cluster.scheduler == "local":
        return True
    from hpc_grpo.cluster import slurm
    from hpc_grpo.planning.preflight import _plan_talks_to_it

    if not _plan_talks_to_it(spec):
        return False
    import ipaddress
    import socket

    try:
        nodes = slurm.partition_nodes(spec.recipe.resources.partition or spec.cluster.partition)
        addresses = list(slurm.node_addresses([n.name for n in nodes]).values())
    except slurm.SlurmError:
        return False

    def local(address: str) -> bool:
        try:
            return ipaddress.ip_address(address).is_loopback
        except ValueError:
            return address in ("localhost", socket.gethostname())

    return bool(addresses) and all(local(a) for a in addresses)


def check_code_isolation(spec: RunSpec) -> tuple[str | None, list[Finding]]:
    """What the code sandbox will have on the compute nodes (hpc_grpo.cluster.isolation.py) and whether the
    reward will refuse there. Probed when the nodes are this machine (~20 ms, once per process); on a remote
    cluster the job probes each node at its start and prints the result in its log."""
    if not runs_policy_code(spec):
        return None, []
    from hpc_grpo.cluster import isolation

    key, setting = isolation.KEY, spec.recipe.grpo.code.isolation
    if setting == "limits-only":
        return (f"{isolation.describe('limits-only')} ({key}=limits-only)",
                [warning(key, "limits-only: the model's code runs with your rights on the compute nodes (your "
                         "files, ~/.netrc, the network): only resource limits bound it",
                         f"set {key}=auto where the nodes have user namespaces")])
    if not nodes_are_this_machine(spec):
        return ("root or unprivileged user namespaces: probed at job start on each node (the job log prints the "
                f"result); the reward refuses to run where neither works, unless {key}=limits-only"), []
    found = isolation.probe()
    if found.mode == "limits-only":
        return "none: no namespaces on this machine (probed)", [error(key, *isolation.refusal_parts(found))]
    return f"{isolation.describe(found.mode)} (probed on this machine)", []


# ----------------------------------------------------------------------------------------- plan
def run_plan(spec: RunSpec, schema: bool = True, for_submit: bool = False) -> Plan:
    """All checks; the engine's own schema last (it is the slowest and needs verl's YAMLs)."""
    lay = layout_of(spec)
    try:
        shape = resolve_shape(spec.recipe.model.path)
        shape_error: list[Finding] = []
    except ValueError as exc:
        shape, shape_error = None, [error("model.path", f"cannot read the model's config.json: {exc}",
                                          "point model.path at a complete Hugging Face model folder")]
    plan = Plan(spec=spec, layout=lay, shape=shape, findings=shape_error)
    checks: list[Callable[[], list[Finding]]] = [
        lambda: check_resources(spec, lay),
        lambda: check_layout(spec, lay, shape),
        lambda: check_batches(spec, lay),
        lambda: check_environment(spec, for_submit),
        lambda: check_eval(spec, for_submit),
    ]
    for check in checks:
        plan.findings.extend(check())
    plan.code_isolation, found = check_code_isolation(spec)
    plan.findings.extend(found)
    from hpc_grpo.planning.preflight import run_preflight  # the runs root's room (check_disk's job) is checked there

    plan.findings = run_preflight(spec, shape, plan.findings, for_submit)
    mem, plan.memory = check_memory(spec, lay, shape)
    plan.findings.extend(mem)
    plan.findings.extend(check_rollout(spec, shape, plan.memory))
    from hpc_grpo.planning.schedule import make_schedule, schedule_findings

    plan.schedule = make_schedule(spec, shape)
    plan.findings.extend(schedule_findings(plan.schedule))
    engine = get_engine(spec.recipe.engine)
    engine_findings = engine.check(spec)
    plan.findings.extend(engine_findings)
    if spec.recipe.engine == "verl" and schema:
        plan.schema_checked, found = schema_check(spec, engine_findings)
        plan.findings.extend(found)
    elif spec.recipe.engine == "verl":
        plan.schema_checked = "disabled (--no-schema)"
    else:
        plan.schema_checked = "not applicable (trl: GRPOConfig is built and checked in the job)"
    return plan


def schema_check(spec: RunSpec, already: list[Finding]) -> tuple[str, list[Finding]]:
    """Compose against verl's YAMLs; keys the engine check already flagged are left out."""
    from hpc_grpo.engines.verl import VerlEngine
    from hpc_grpo.engines.verl_schema import compose_check, verl_config_dir, verl_version

    folder = verl_config_dir()
    if folder is None:
        return "skipped: verl's config files are not installed (pip install --no-deps verl hydra-core omegaconf)", []
    cmd = VerlEngine().command(spec)
    flagged = {f.key.removeprefix("passthrough.") for f in already}
    overrides = [o for o in cmd.overrides if o.split("=", 1)[0] not in flagged]
    found = compose_check(cmd.config_name, overrides, folder)
    status = (f"composed against verl {verl_version()} '{cmd.config_name}' (key tree cached per verl version and config hash): "
              + ("rejected" if found else "ok"))
    return status, found
