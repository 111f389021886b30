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

from hpc_grpo.engines import get_engine, sync_break
from hpc_grpo.engines.verl_checks import check_batches, check_layout, check_rollout
from hpc_grpo.common.findings import Finding, Severity, cannot_read, error, has_errors, info, warning
from hpc_grpo.config.layout import Layout, layout_of
from hpc_grpo.config.models import ModelShape, resolve_shape
from hpc_grpo.planning.container import check_container
from hpc_grpo.planning.lora_targets import check_lora_targets, lora_off
from hpc_grpo.planning.resources import check_resources
from hpc_grpo.common.yamlio import SpecError
from hpc_grpo.config.spec import Acceptance, RunSpec
from hpc_grpo.config import reward_registry as rewards

# Checks whose findings are estimates, not rules an engine enforces: only their errors can be accepted (--accept).
ACCEPTABLE = {"memory": "the per-GPU memory estimate (rough by design: good to tens of percent)"}


@dataclass
class Plan:
    spec: RunSpec
    layout: Layout
    shape: ModelShape | None
    findings: list[Finding] = field(default_factory=list)
    memory: object | None = None
    schedule: object | None = None
    cost: object | None = None  # planning.cost.Cost: wall time, GPU-hours, checkpoint disk
    schema_checked: str = "skipped"
    code_isolation: str | None = None  # what the code sandbox gets on the compute nodes (code recipes only)
    # plan --diff-defaults: the verl keys this run sets away from verl's defaults (engines.verl_defaults), or why not
    defaults_diff: list | None = None
    defaults_note: str = ""

    @property
    def ok(self) -> bool:
        return not has_errors(self.findings)


# ------------------------------------------------------------------------------------ misc/env
def check_environment(spec: RunSpec, for_submit: bool) -> list[Finding]:
    r = spec.recipe
    out: list[Finding] = []
    if sync_break.enabled():  # a test hook, inherited by the job from this environment: said loudly
        out.append(warning("environment", sync_break.warning(), f"`unset {sync_break.ENV}`"))
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
    if not e.runs:  # off, or nothing to evaluate (summary says which): no eval files to ask for
        return []
    from hpc_grpo.evaluation.evaluate import data_files, eval_resources, needs_files

    out: list[Finding] = []
    try:
        gpus = eval_resources(spec).gpus
        if e.resources.gpus_per_node is not None and gpus > spec.cluster.gpus_per_node:  # else: the training's
            out.append(error("eval.resources.gpus_per_node", f"the eval job asks for {gpus} GPUs on one node; "
                             f"cluster {spec.cluster.name} nodes have {spec.cluster.gpus_per_node}",
                             f"set eval.resources.gpus_per_node<={spec.cluster.gpus_per_node}"))
    except SpecError as exc:  # the message names the key, the value and the fix
        if not (e.tp is None and e.resources.gpus_per_node is None and exc.key == "eval.tp"):
            out.append(error(exc.key, exc.message))
        # else: the eval job's TP is the rollout's on the training node's GPUs: check_layout's rollout TP error has it
    if e.resources.time_min > spec.cluster.time_max_min:
        out.append(error("eval.resources.time", f"{e.resources.time} is over the cluster's limit {spec.cluster.time_max}",
                         "lower eval.resources.time or eval.limit"))
    try:
        if needs_files(e.tasks):
            data_files(spec)
    except SpecError as exc:
        out.append((error if for_submit else warning)(exc.key or "eval.test_file", exc.message,
                                                      "or set eval.enabled=false"))
    return out


def runs_policy_code(spec: RunSpec) -> bool:
    """The run executes model-written code: the execution reward, or a HumanEval evaluation."""
    e = spec.recipe.eval
    return rewards.get(spec.recipe.grpo.reward).runs_code or (e.runs and "humaneval" in e.tasks)


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
    from hpc_grpo.sandbox.sandbox_kernel import memory_rule
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
def check_accept(names: list[str]) -> list[str]:
    """The --accept values, each an estimate's check; SpecError (exit 2) naming the acceptable ones otherwise."""
    for name in names:
        if name not in ACCEPTABLE:
            known = "; ".join(f"{k}: {v}" for k, v in ACCEPTABLE.items())
            raise SpecError(f"--accept {name}: only an estimate's finding can be accepted, and '{name}' is not one "
                            f"(a rule's error, such as a layout or batch rule, must be fixed). Acceptable: {known}",
                            key="--accept")
    return list(dict.fromkeys(names))


def apply_acceptances(spec: RunSpec, findings: list[Finding], names: list[str]) -> tuple[RunSpec, list[Finding]]:
    """Accepted estimates' errors become warnings that say so; the spec records each (frozen in spec.yaml)."""
    kept: list[Finding] = []
    accepted: list[Acceptance] = []
    for f in findings:
        name = next((n for n in names if f.key == n or f.key.startswith(n + ".")), None)
        if name and f.estimate and f.severity is Severity.ERROR:
            accepted.append(Acceptance(check=name, finding=f"{f.key}: {f.message}"))
            kept.append(Finding(Severity.WARNING, f.key, f"accepted (--accept {name}): {f.message}", f.fix, estimate=True))
        else:
            kept.append(f)
    for name in names:
        if not any(a.check == name for a in accepted):
            kept.append(info("--accept", f"{name}: no error of this estimate to accept; nothing recorded"))
    return spec.model_copy(update={"accepted": accepted}), kept


def run_plan(spec: RunSpec, schema: bool = True, for_submit: bool = False, accept: list[str] | None = None,
             diff_defaults: bool = False) -> Plan:
    """All checks; the engine's own schema last (it is the slowest and needs verl's YAMLs).

    accept: estimates whose errors the user accepts (check_accept); None = those the spec already records (resume).
    plan.spec then records what was accepted: render the run from it. diff_defaults: also compare the run's verl
    config with verl's defaults (two more Hydra composes, ~1-3 s)."""
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
        lambda: lora_off(spec),
        lambda: check_container(spec),
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
    from hpc_grpo.planning.cost import run_cost

    plan.cost = run_cost(spec, plan.schedule)
    engine = get_engine(spec.recipe.engine)
    engine_findings = engine.check(spec)
    plan.findings.extend(engine_findings)
    if not engine.traits.hydra_config:
        plan.schema_checked = f"not applicable ({engine.traits.no_schema_note})"
    elif schema:
        plan.schema_checked, found = schema_check(spec, engine_findings)
        plan.findings.extend(found)
    else:
        plan.schema_checked = "disabled (--no-schema)"
    names = check_accept(accept) if accept is not None else [a.check for a in spec.accepted]
    plan.spec, plan.findings = apply_acceptances(spec, plan.findings, names)
    if diff_defaults:
        plan.defaults_diff, plan.defaults_note = defaults_diff(spec, plan)
    return plan


def defaults_diff(spec: RunSpec, plan: Plan) -> tuple[list | None, str]:
    """The run's verl keys that differ from verl's defaults, or why they cannot be listed."""
    traits = get_engine(spec.recipe.engine).traits
    if not traits.hydra_config:
        return None, f"not applicable: {traits.name} has no verl config ({traits.no_schema_note})"
    from hpc_grpo.engines.verl_schema import verl_config_dir, verl_version

    folder = verl_config_dir()
    if folder is None:
        return None, "not available: verl's config files are not installed (pip install --no-deps verl hydra-core omegaconf)"
    if any(f.key.startswith(("engine.", "passthrough.")) for f in plan.findings if f.severity is Severity.ERROR):
        return None, "not computed: verl's config rejects this run's overrides (see the errors below)"
    from hpc_grpo.engines.verl_defaults import diff_defaults

    found = diff_defaults(spec, folder)
    return found, f"{len(found)} verl keys differ from verl {verl_version()}'s defaults"


def schema_check(spec: RunSpec, already: list[Finding]) -> tuple[str, list[Finding]]:
    """Compose against verl's YAMLs, then check the values against verl's config dataclasses (what its runtime
    builds from them); keys the engine check already flagged are left out."""
    from hpc_grpo.engines.verl import VerlEngine
    from hpc_grpo.config.verl_keys import bare_key
    from hpc_grpo.engines.verl import modelled_overrides
    from hpc_grpo.engines.verl_dataclasses import dataclass_check
    from hpc_grpo.engines.verl_values import value_check
    from hpc_grpo.engines.verl_schema import compose_check, key_tree, plus_typos, verl_config_dir, verl_version

    folder = verl_config_dir()
    if folder is None:
        return "skipped: verl's config files are not installed (pip install --no-deps verl hydra-core omegaconf)", []
    cmd = VerlEngine().command(spec)
    flagged = {f.key.removeprefix("passthrough.") for f in already}
    overrides = [o for o in cmd.overrides if o.split("=", 1)[0] not in flagged]
    found = compose_check(cmd.config_name, overrides, folder)
    typos = {f.key for f in plus_typos(overrides, key_tree(cmd.config_name, folder))}  # Hydra itself adds these
    if not has_errors([f for f in found if f.key not in typos]):  # else Hydra stops the job before any dataclass
        built = dataclass_check(cmd.config_name, overrides, folder)
        # One error for one cause: a '+' typo in a node verl builds a dataclass from fails at start-up; that
        # finding (quoting verl's TypeError) replaces the typo's
        failing = {f.key for f in built if f.severity is Severity.ERROR}
        found = [f for f in found if f.key not in failing] + built
        sources = {bare_key(o.key): o.source for o in modelled_overrides(spec) if not o.source.startswith(("engine", "run "))}
        found += [f for f in value_check(overrides, folder, sources) if f.key not in failing]
    status = (f"composed against verl {verl_version()} '{cmd.config_name}' and checked against its config dataclasses "
              "(cached per verl version and config hash): " + ("rejected" if has_errors(found) else "ok"))
    return status, found
