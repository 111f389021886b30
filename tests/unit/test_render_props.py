"""Properties of what every recipe x cluster pair renders: the whole matrix, where the golden files pin a set.

Each pair is rendered with the golden inputs (tests/unit/test_golden.py) and its scripts are run by bash itself, with
the commands that would leave the machine (srun, module, conda, the venv's activate, the final exec) replaced by a
function that prints its arguments and the exported environment. What the scripts hand to Slurm, srun, the node
launcher and the driver is then compared with what the spec and the plan's layout say:

- the #SBATCH lines ask for the plan's layout: the recipe's nodes, one task per node, its GPUs per node in the
  profile's form (none for a CPU job), its time limit; the eval script exists exactly when submit queues an eval job;
- the launch script starts that layout: the node launcher's --nodes and --gpus-per-node, verl's trainer.nnodes,
  trainer.n_gpus_per_node and parallel sizes, the driver's argv and environment exactly as the engine built them;
- every value reaches bash exactly (the profile's env, the run directory, the interpreter, srun's options);
- every value in a script went through the one shell filter (`sh` in hpc_grpo/launch/render.py): rendered with
  that filter marking its output, no value of the spec appears outside a marked word;
- the frozen spec.yaml reads back to the spec it was written from.

Checked elsewhere over the same matrix, so not here: `bash -n` and shellcheck, the generated-by header
(test_render.py), no secret in any rendered file (test_quoting.py), the eval job's GPUs (test_eval_resources.py).
"""

from __future__ import annotations

import re
import shlex
import subprocess
from pathlib import Path

import pytest

from hpc_grpo.common.slurm_time import parse_time_minutes
from hpc_grpo.config import registry
from hpc_grpo.config.layout import layout_of
from hpc_grpo.config.resolve import load_frozen, resolve_spec
from hpc_grpo.config.spec import RunSpec
from hpc_grpo.engines import get_engine
from hpc_grpo.evaluation import evaluate
from hpc_grpo.launch import render
from hpc_grpo.runstate import layout
from tests.unit.test_golden import MATRIX, NOW, OVERRIDES, RUN_NAME, pinned_env  # noqa: F401 (pinned_env: a fixture)

IDS = [f"{r}__{c}" for r, c in MATRIX]
pytestmark = pytest.mark.usefixtures("pinned_env")  # the golden inputs: HOME, USER, no secrets
SBATCH_RE = re.compile(r"^#SBATCH --([a-z-]+)(?:=(.*))?$", re.M)
# Stand-ins for what would leave this machine; `report` prints its arguments, a separator, then the environment.
STUBS = r"""
module() { :; }
conda() { :; }
source() { :; }
rm() { :; }
cd() { :; }
scontrol() { :; }
report() { printf '%s\0' "$@"; printf '\1\0'; env -0; exit 0; }
srun() { report "$@"; }
"""


def spec_and_files(recipe: str, cluster: str) -> tuple[RunSpec, dict[str, str]]:
    spec = resolve_spec(recipe, cluster, list(OVERRIDES), run_name=RUN_NAME, now=NOW)
    return spec, render.render_all(spec)


def run_stubbed(script: str) -> tuple[list[str], dict[str, str]]:
    """Run a rendered script in a clean environment with STUBS, its `exec` lines calling `report`: the argv and the
    exported environment of the command it starts."""
    body = re.sub(r"^exec ", "report ", script, flags=re.M)
    proc = subprocess.run(["bash", "-c", STUBS + body], env={"PATH": "/usr/bin:/bin", "LC_ALL": "C",
                                                               "SLURM_JOB_ID": "1"},
                          capture_output=True, check=False)
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")
    argv_part, sep, env_part = proc.stdout.partition(b"\1\0")
    assert sep, f"the script started nothing: {proc.stdout!r}"
    argv = [a.decode() for a in argv_part.split(b"\0")[:-1]]
    env = dict(e.decode().split("=", 1) for e in env_part.split(b"\0") if b"=" in e)
    return argv, env


def sbatch_options(text: str) -> dict[str, str]:
    """#SBATCH --key=value lines as sbatch reads them (each value one quoted word, or none for a flag)."""
    out = {}
    for key, value in SBATCH_RE.findall(text):
        words = shlex.split(value) if value else [""]
        assert len(words) == 1, f"#SBATCH --{key}={value}: not one word"
        assert key not in out, f"#SBATCH --{key} twice"
        out[key] = words[0]
    return out


def gpu_option(spec: RunSpec, gpus: int) -> dict[str, str]:
    """The GPU request the profile's form asks for `gpus` per node (none for a CPU job)."""
    c = spec.cluster
    if gpus == 0:
        return {}
    if c.gpu_request == "gres":
        return {"gres": f"gpu:{c.gpu_type}:{gpus}" if c.gpu_type else f"gpu:{gpus}"}
    return {"gpus-per-node": f"{c.gpu_type}:{gpus}" if c.gpu_type else str(gpus)}


def value_after(argv: list[str], flag: str) -> str:
    assert argv.count(flag) == 1, (flag, argv)
    return argv[argv.index(flag) + 1]


def overrides_of(argv: list[str]) -> dict[str, str]:
    return dict(a.split("=", 1) for a in argv if "=" in a and not a.startswith("-"))


# --------------------------------------------------------------------------------- the batch scripts
@pytest.mark.parametrize(("recipe", "cluster"), MATRIX, ids=IDS)
def test_the_batch_script_asks_for_the_plans_layout_and_starts_one_task_per_node(recipe: str, cluster: str) -> None:
    spec, files = spec_and_files(recipe, cluster)
    plan = layout_of(spec)
    opts = sbatch_options(files["scripts/sbatch.sh"])
    assert int(opts["nodes"]) * spec.procs_per_node == plan.world_size
    assert int(opts["nodes"]) == spec.recipe.resources.nodes and opts["ntasks-per-node"] == "1"
    assert {k: v for k, v in opts.items() if k in ("gres", "gpus-per-node")} == gpu_option(spec, plan.gpus_per_node)
    assert int(opts["time"]) == parse_time_minutes(spec.recipe.resources.time)
    assert ("requeue" in opts) == (spec.cluster.requeue and spec.cluster.restart == "requeue")

    argv, env = run_stubbed(files["scripts/sbatch.sh"])
    assert argv[-5:] == [spec.python, "-u", "-m", "submitit.core._submit", str(layout.submitit_dir(spec.path))]
    assert value_after(argv, "--output").startswith(str(layout.submitit_dir(spec.path)) + "/")
    container = spec.cluster.setup.container
    assert (f"--container-image={container}" in argv) == bool(container), argv
    if container:
        mounts = next(a for a in argv if a.startswith("--container-mounts=")).split("=", 1)[1]
        assert f"{spec.run_dir}:{spec.run_dir}" in mounts.split(","), mounts
    expected_env = {**spec.cluster.env, "HPC_GRPO_RUN_DIR": spec.run_dir, "SUBMITIT_EXECUTOR": "slurm"}
    assert {k: env.get(k) for k in expected_env} == expected_env


@pytest.mark.parametrize(("recipe", "cluster"), MATRIX, ids=IDS)
def test_the_eval_script_exists_exactly_when_an_eval_job_is_queued(recipe: str, cluster: str) -> None:
    spec, files = spec_and_files(recipe, cluster)
    assert ("scripts/eval_sbatch.sh" in files) == evaluate.queued_after_training(spec)
    if "scripts/eval_sbatch.sh" in files:
        opts = sbatch_options(files["scripts/eval_sbatch.sh"])
        eval_spec = evaluate.eval_spec(spec)
        assert (opts["nodes"], opts["ntasks-per-node"]) == ("1", "1")
        assert int(opts["time"]) == parse_time_minutes(eval_spec.recipe.resources.time)
        argv, _ = run_stubbed(files["scripts/eval_sbatch.sh"])
        assert argv[-4:-1] == ["-u", "-m", "submitit.core._submit"]


# --------------------------------------------------------------------------------- the launch scripts
def check_verl_layout(spec: RunSpec, driver: list[str]) -> None:
    """verl's own driver: the trainer's shape and the parallel sizes are the plan's."""
    plan, ov = layout_of(spec), overrides_of(driver)
    assert (ov["trainer.nnodes"], ov["trainer.n_gpus_per_node"]) == (str(spec.recipe.resources.nodes),
                                                                     str(spec.procs_per_node))
    assert ov["actor_rollout_ref.rollout.tensor_model_parallel_size"] == str(plan.rollout_tp)
    if spec.recipe.backend == "megatron":
        for key, size in (("tensor_model", plan.tp), ("pipeline_model", plan.pp), ("context", plan.cp),
                          ("expert_model", plan.ep)):
            for role in ("actor", "ref"):
                assert ov[f"actor_rollout_ref.{role}.megatron.{key}_parallel_size"] == str(size), (role, key)


@pytest.mark.parametrize(("recipe", "cluster"), MATRIX, ids=IDS)
def test_the_launch_script_starts_the_layout_with_the_engines_command_exactly(recipe: str, cluster: str) -> None:
    spec, files = spec_and_files(recipe, cluster)
    cmd = get_engine(spec.recipe.engine).command(spec)
    custom = spec.recipe.launch.driver
    expected_driver = ([spec.python, *custom[1:]] if custom[0] in ("python", "python3") else list(custom)) \
        if custom else cmd.argv
    argv, env = run_stubbed(files["scripts/launch.sh"])
    if get_engine(spec.recipe.engine).launch_template == "trl_launch.sh.j2":
        assert argv == expected_driver
        assert {k: env.get(k) for k in cmd.env} == cmd.env
        return
    assert argv[:3] == [spec.python, "-m", "hpc_grpo.job.verl_node"]
    assert value_after(argv, "--spec") == str(layout.spec_file(spec.path))
    assert value_after(argv, "--nodes") == str(spec.recipe.resources.nodes)
    assert value_after(argv, "--gpus-per-node") == str(spec.procs_per_node)
    assert ("--resume" in argv) == (custom is None)
    local = spec.cluster.scheduler == "local"
    assert ("--local-address" in argv) == local and (not local or value_after(argv, "--local-address")
                                                     == spec.cluster.local_address)
    sep = argv.index("--")
    assert argv[argv.index("--driver-env") + 1:sep] == [f"{k}={v}" for k, v in sorted(cmd.env.items())]
    assert argv[sep + 1:] == expected_driver
    assert {k: env.get(k) for k in cmd.node_env} == cmd.node_env
    if custom is None:
        check_verl_layout(spec, expected_driver)


# --------------------------------------------------------------------------------- the one shell filter
MARK_OPEN, MARK_CLOSE = "\x02", "\x03"  # never in quote_word's output: it escapes every control character


def spec_strings(value: object) -> set[str]:
    """Every string leaf of the spec's data (keys of mappings too)."""
    if isinstance(value, dict):
        return {s for k, v in value.items() for s in (str(k), *spec_strings(v))}
    if isinstance(value, list):
        return {s for v in value for s in spec_strings(v)}
    return {value} if isinstance(value, str) else set()


def template_text() -> str:
    return "".join(p.read_text(encoding="utf-8") for p in registry.template_dir().glob("*.j2"))


@pytest.mark.parametrize(("recipe", "cluster"), MATRIX, ids=IDS)
def test_every_value_in_a_script_went_through_the_one_shell_filter(recipe: str, cluster: str,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """A value that reached a script some other way (a pre-quoted string handed to a template, text pasted in by
    Python) would appear outside the marks."""
    quote = render.quote_word
    monkeypatch.setattr(render, "quote_word", lambda text: MARK_OPEN + quote(text) + MARK_CLOSE)
    spec, files = spec_and_files(recipe, cluster)
    literal = template_text()
    values = {s for s in spec_strings(spec.model_dump(mode="json")) | {spec.run_dir, spec.python}
              if len(s) >= 4 and s not in literal}
    assert spec.run_dir in values and spec.recipe.model.path in values
    for rel, text in files.items():
        if not rel.endswith(".sh"):
            continue
        assert MARK_OPEN in text
        outside = re.sub(f"{MARK_OPEN}[^{MARK_CLOSE}]*{MARK_CLOSE}", "\0", text)
        leaked = sorted(v for v in values if v in outside)
        assert not leaked, f"{rel}: values outside the shell filter: {leaked}"


# --------------------------------------------------------------------------------- the frozen spec
@pytest.mark.parametrize(("recipe", "cluster"), MATRIX, ids=IDS)
def test_the_frozen_spec_reads_back_to_the_spec(recipe: str, cluster: str, tmp_path: Path) -> None:
    spec, files = spec_and_files(recipe, cluster)
    render.write_files(tmp_path, files)
    assert load_frozen(tmp_path / layout.SPEC_FILE) == spec
