"""The job's shape and whether the cluster profile has it: Layout (world size and parallel sizes, the numbers every
other check reads) and the resource checks (nodes, GPUs, CPUs, memory, time against the profile, verl's CPU mode).

Its own module because both plan and preflight read it (preflight asks which other profiles pass these checks).
"""

from __future__ import annotations

from dataclasses import dataclass

from hpc_grpo.common.findings import Finding, error, info
from hpc_grpo.config.spec import RunSpec


@dataclass
class Layout:
    """The numbers every other check and the plan table use."""

    world_size: int
    gpus_per_node: int
    tp: int
    pp: int
    cp: int
    ep: int
    dp: int
    rollout_tp: int


def layout_of(spec: RunSpec) -> Layout:
    r = spec.recipe
    p = r.parallel
    mp = p.tp * p.pp * p.cp if r.backend == "megatron" else 1
    world = spec.world_size
    return Layout(
        world_size=world,
        gpus_per_node=spec.gpus_per_node,
        tp=p.tp,
        pp=p.pp,
        cp=p.cp,
        ep=p.ep,
        dp=world // mp if mp and world % mp == 0 else 0,
        rollout_tp=p.rollout_tp,
    )


# ------------------------------------------------------------------------------------ resources
def check_resources(spec: RunSpec, lay: Layout) -> list[Finding]:
    r, c = spec.recipe, spec.cluster
    out: list[Finding] = []
    if r.resources.nodes > c.nodes_max:
        out.append(error("resources.nodes", f"{r.resources.nodes} nodes asked, cluster '{c.name}' has {c.nodes_max}",
                         f"use resources.nodes<={c.nodes_max} or a bigger cluster"))
    if lay.gpus_per_node > c.gpus_per_node:
        out.append(error("resources.gpus_per_node", f"{lay.gpus_per_node} GPUs per node asked, '{c.name}' nodes have {c.gpus_per_node}",
                         f"use resources.gpus_per_node<={c.gpus_per_node}"))
    if r.resources.time_min > c.time_max_min:
        out.append(error("resources.time", f"{r.resources.time} exceeds the cluster's limit {c.time_max}",
                         f"use resources.time<={c.time_max}; the job resumes from checkpoints after a time limit"))
    if r.resources.cpus_per_task and r.resources.cpus_per_task > c.cpus_per_node:
        out.append(error("resources.cpus_per_task", f"{r.resources.cpus_per_task} CPUs asked, nodes have {c.cpus_per_node}",
                         f"use resources.cpus_per_task<={c.cpus_per_node}"))
    if r.resources.mem_gb and r.resources.mem_gb > c.mem_per_node_gb:
        out.append(error("resources.mem_gb", f"{r.resources.mem_gb} GB asked, nodes have {c.mem_per_node_gb:g} GB",
                         f"use resources.mem_gb<={c.mem_per_node_gb:g}"))
    if c.scheduler == "local" and r.resources.nodes > 1:
        out.append(error("resources.nodes", "cluster 'local' has no scheduler and runs one node",
                         "use resources.nodes=1 or a Slurm cluster"))
    out += check_verl_cpu(spec)
    if r.engine == "trl" and r.resources.nodes > 1:
        out.append(error("resources.nodes", "the trl engine runs on one node", "use resources.nodes=1 or engine verl"))
    return out


def check_verl_cpu(spec: RunSpec) -> list[Finding]:
    """verl on CPU (no GPU given) runs FSDP with the HF-sampling rollout; the HF rollout exists only there."""
    r = spec.recipe
    if r.engine != "verl":
        return []
    out: list[Finding] = []
    if spec.verl_cpu:
        if r.backend != "fsdp":
            out.append(error("backend", f"'{r.backend}' needs GPUs (Megatron's kernels); this job has none, so verl "
                             "would run in its CPU mode, which trains with FSDP only",
                             "use a GPU cluster profile (resources.gpus_per_node > 0), or backend=fsdp"))
        if r.rollout.name != "hf":
            out.append(error("rollout.name", f"'{r.rollout.name}' needs GPUs; this job has none (verl's CPU mode)",
                             "use rollout.name=hf on CPU, or give the job GPUs (resources.gpus_per_node)"))
        out.append(info("resources.gpus_per_node", f"0 GPUs: verl's real trainer runs in its CPU mode, "
                        f"{spec.procs_per_node} training process(es) per node on gloo, sampling with hpc-grpo's HF "
                        "server instead of vLLM (verl 0.9.1 only; not exercised: vLLM, NCCL, GPU memory)"))
    elif r.rollout.name == "hf":
        out.append(error("rollout.name", "'hf' is verl's CPU-mode sampler (hpc-grpo's stand-in for vLLM), and this "
                         f"job has {spec.gpus_per_node} GPUs per node", "use rollout.name=vllm"))
    return out
