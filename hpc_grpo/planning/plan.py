"""`hpc-grpo plan`: every pre-submit check in one pass, RunSpec -> Plan (layout, findings, memory, schedule).

Each check is a small function RunSpec -> findings in the module that owns its rule: the cluster profile's room
(planning.resources), the engines' own rules (engines.verl_checks, engines.trl), memory (engines.verl_memory),
preflight on the real machines (planning.preflight, with the disk room of planning.disk), the schedule. Here:
the order they run in, the W&B credentials, the chained evaluation, and verl's schema (last: the slowest).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from hpc_grpo.engines import get_engine
from hpc_grpo.engines.verl_checks import check_batches, check_layout, check_rollout
from hpc_grpo.common.findings import Finding, cannot_read, error, has_errors, warning
from hpc_grpo.config.layout import Layout, layout_of
from hpc_grpo.config.models import ModelShape, resolve_shape
from hpc_grpo.planning.lora_targets import check_lora_targets
from hpc_grpo.planning.resources import check_resources
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
    """The isolation (_code_isolation) and what caps the sandbox's memory, on one line."""
    line, findings = _code_isolation(spec)
    if line is None:
        return line, findings
    from hpc_grpo.job.sandbox_kernel import memory_rule
    from hpc_grpo.rewards.code import RewardWeights

    return f"{line}; {memory_rule(spec.recipe.grpo.code.memory_mb, RewardWeights().max_procs)}", findings


def _code_isolation(spec: RunSpec) -> tuple[str | None, list[Finding]]:
    """What the code sandbox will have on the compute nodes (hpc_grpo/cluster/isolation.py) and whether the
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
        lambda: check_lora_targets(spec),
    ]
    for check in checks:
        plan.findings.extend(check())
    plan.code_isolation, found = check_code_isolation(spec)
    plan.findings.extend(found)
    from hpc_grpo.planning.preflight import run_preflight  # the runs root's room (check_disk's job) is checked there

    plan.findings = run_preflight(spec, shape, plan.findings, for_submit)
    from hpc_grpo.engines.verl_memory import check_memory

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
    """Compose against verl's YAMLs, then check the values against verl's config dataclasses (what its runtime
    builds from them); keys the engine check already flagged are left out."""
    from hpc_grpo.engines.verl import VerlEngine
    from hpc_grpo.engines.verl_dataclasses import dataclass_check
    from hpc_grpo.engines.verl_schema import compose_check, verl_config_dir, verl_version

    folder = verl_config_dir()
    if folder is None:
        return "skipped: verl's config files are not installed (pip install --no-deps verl hydra-core omegaconf)", []
    cmd = VerlEngine().command(spec)
    flagged = {f.key.removeprefix("passthrough.") for f in already}
    overrides = [o for o in cmd.overrides if o.split("=", 1)[0] not in flagged]
    found = compose_check(cmd.config_name, overrides, folder)
    if not has_errors(found):  # Hydra would stop the job first; the dataclasses need a config Hydra composes
        found += dataclass_check(cmd.config_name, overrides, folder)
    status = (f"composed against verl {verl_version()} '{cmd.config_name}' and checked against its config dataclasses "
              "(cached per verl version and config hash): " + ("rejected" if has_errors(found) else "ok"))
    return status, found
