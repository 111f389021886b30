"""Whether the cluster profile can give what the recipe asks: nodes, GPUs, time, CPUs and memory per node, and
the engines' own limits on them (verl's CPU mode, trl's single node). Preflight asks Slurm itself; this asks the
profile."""

from __future__ import annotations

from hpc_grpo.common.findings import Finding, error
from hpc_grpo.config.spec import RunSpec
from hpc_grpo.config.engine_traits import TRAITS
from hpc_grpo.engines import get_engine
from hpc_grpo.engines.verl_checks import check_verl_cpu
from hpc_grpo.config.layout import Layout


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
    if r.resources.nodes > 1 and not get_engine(r.engine).traits.multi_node:
        spread = " or ".join(f"engine {t.name}" for t in TRAITS.values() if t.multi_node)
        out.append(error("resources.nodes", f"the {r.engine} engine runs on one node",
                         f"use resources.nodes=1 or {spread}"))
    return out
