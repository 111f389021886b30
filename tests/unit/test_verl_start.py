"""What a verl job needs to start, checked on the rendered files; the real start is tests/slurm/test_verl_main_ppo.py.

- no `ray_kwargs.ray_init.num_cpus` for a driver that joins the job's Ray; the CPUs go on `ray start --num-cpus`,
  raised to what the pinned verl's placement groups reserve (3 per GPU) plus its controller actors;
- one interpreter, frozen in spec.yaml, for submitit's srun line, Ray's CLI, the join wait, the probe and
  the drivers; its precedence: setup.python, <setup.venv>/bin/python, conda/container python3, the submitter's;
- Slurm's ROCR_VISIBLE_DEVICES is dropped when it only repeats CUDA_VISIBLE_DEVICES (verl refuses both;
  hpc_grpo.job.node_plan.node_environ), and Ray's log monitor stays on (without it verl's per-step output never reaches the job log).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from hpc_grpo.config import registry
from hpc_grpo.engines import get_engine
from hpc_grpo.engines.verl import CPUS_PER_GPU_BUNDLE, ray_cpus_per_node
from hpc_grpo.common.findings import Severity
from hpc_grpo.job import node_plan
from hpc_grpo.launch.render import render_all
from hpc_grpo.config.resolve import job_python, load_frozen, resolve_spec
from hpc_grpo.config.cluster import Setup

VERL_RECIPES = [r for r in registry.list_names("recipes") if r not in ("tiny-gsm8k",)]
CLUSTERS = registry.list_names("clusters")


@pytest.fixture(autouse=True)
def pinned(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", "/home/user")
    monkeypatch.setenv("USER", "user")
    monkeypatch.delenv("HPC_GRPO_PATH", raising=False)


def spec_of(recipe: str, cluster: str = "slurm-dev", *overrides: str):
    return resolve_spec(recipe, cluster, ["cluster.runs_root=/runs", *overrides], run_name="t", now=0.0)


# ------------------------------------------------------------------------------------------ the driver's Ray CPUs
@pytest.mark.parametrize("recipe", VERL_RECIPES)
def test_driver_gets_no_ray_cpu_count(recipe: str) -> None:
    spec = spec_of(recipe)
    cmd = get_engine("verl").command(spec)
    assert not [o for o in cmd.overrides if "ray_init.num_cpus" in o or "ray_init.num_gpus" in o], cmd.overrides
    launch = render_all(spec)["scripts/launch.sh"]
    assert "ray_init.num_cpus" not in launch


@pytest.mark.parametrize("key", ["ray_kwargs.ray_init.num_cpus", "++ray_kwargs.ray_init.num_gpus"])
def test_passthrough_ray_counts_for_the_driver_are_refused(key: str) -> None:
    spec = spec_of("qwen2.5-3b-gsm8k-lora", "slurm-dev", f"{key}=4")
    errs = {f.key: str(f) for f in get_engine("verl").check(spec) if f.severity is Severity.ERROR}
    assert f"passthrough.{key}" in errs, errs
    assert "existing cluster" in errs[f"passthrough.{key}"] and "resources.cpus_per_task" in errs[f"passthrough.{key}"]


@pytest.mark.parametrize("cluster", ["slurm-dev", "a100-ib"])
def test_ray_start_offers_the_cpus_verl_reserves(cluster: str) -> None:
    spec = spec_of("qwen2.5-3b-gsm8k-lora", cluster)
    cpus = ray_cpus_per_node(spec)
    # slurm-dev: 4 CPUs per node and 4 GPUs: verl's bundles alone need 12
    assert cpus > CPUS_PER_GPU_BUNDLE * spec.gpus_per_node
    assert cpus >= spec.cluster.cpus_per_node
    launch = render_all(spec)["scripts/launch.sh"]
    assert f" --ray-cpus {cpus} " in launch, launch
    assert f"--num-cpus={cpus}" in node_plan.node_args("10.0.0.1", node_plan.ports("7", 0), 4, cpus, "/tmp/r")


def test_more_slurm_cpus_than_verl_needs_are_all_offered() -> None:
    spec = spec_of("qwen2.5-3b-gsm8k-lora", "slurm-dev", "resources.cpus_per_task=96", "cluster.cpus_per_node=96")
    assert ray_cpus_per_node(spec) == 96


# ------------------------------------------------------------------------------------------ one interpreter
def test_interpreter_precedence() -> None:
    assert job_python(Setup(python="/opt/py/bin/python3.11", venv="/v", conda="c")) == "/opt/py/bin/python3.11"
    assert job_python(Setup(venv="/sw/venvs/hpc")) == "/sw/venvs/hpc/bin/python"
    assert job_python(Setup(conda="hpc-grpo")) == "python3"  # activated in the job before any step
    assert job_python(Setup(container="nvcr.io/nvidia/pytorch:25.01-py3")) == "python3"
    assert job_python(Setup()) == sys.executable


def test_venv_path_is_expanded_on_the_login_node() -> None:
    assert job_python(Setup(venv="~/venvs/x")) == "/home/user/venvs/x/bin/python"
    assert job_python(Setup(python="~/py/bin/python")) == "/home/user/py/bin/python"


@pytest.mark.parametrize("recipe", ["ray-probe", "qwen2.5-7b-codegen", "tiny-gsm8k"])
@pytest.mark.parametrize("cluster", ["slurm-dev", "a100-ib", "h100-efa"])
def test_every_in_job_step_runs_the_frozen_interpreter(recipe: str, cluster: str, tmp_path: Path) -> None:
    spec = spec_of(recipe, cluster)
    files = render_all(spec)
    py = spec.python
    assert py == job_python(spec.cluster.setup)
    # spec.yaml freezes it: a resumed or requeued job reads the same interpreter back
    (tmp_path / "spec.yaml").write_text(files["spec.yaml"])
    assert load_frozen(tmp_path / "spec.yaml").python == py
    # submitit's task on every node
    srun = [line for line in files["scripts/sbatch.sh"].splitlines() if line.startswith("srun ")]
    assert len(srun) == 1 and f" {py} -u -m submitit.core._submit " in srun[0], srun
    launch = files["scripts/launch.sh"]
    # no step calls python3 / ray from PATH
    code = [line for line in launch.splitlines() if not line.lstrip().startswith("#")]
    assert not [line for line in code if re.search(r"(^\s*|\$\(|[;&|]\s*|\bif\s+)(python3?|ray)\s", line)], code
    # the driver (verl's main_ppo, the probe given as `python3 -m ...`, trl's job) starts with the interpreter
    drv = re.search(r"driver=\(\n(.*?)\n\s*\)", launch, re.S)
    assert drv, launch
    assert drv.group(1).split("\n")[0].strip() in (py, f"'{py}'")
    if get_engine(spec.recipe.engine).name == "verl":
        # the node program runs on it, and starts Ray's CLI on its own interpreter (test_verl_node.py)
        assert re.search(rf"^python={re.escape(py)}$", launch, re.M), launch
        assert re.search(r'^exec "\$python" -m hpc_grpo\.job\.verl_node ', launch, re.M), launch


# ------------------------------------------------------------------------------------------ the job's environment
@pytest.mark.parametrize("rocr,cuda,kept", [
    ("0,1,2,3", "0,1,2,3", None),        # Slurm's copy where gres.conf names no vendor: dropped
    ("0,1", "0,1,2,3", "0,1"),           # a real AMD setting differs: kept
    ("", "0,1", ""),
])
def test_rocr_copy_of_cuda_devices_is_dropped(rocr: str, cuda: str, kept: str | None) -> None:
    env = node_plan.node_environ({"PATH": "/usr/bin:/bin", "CUDA_VISIBLE_DEVICES": cuda, "ROCR_VISIBLE_DEVICES": rocr})
    assert env.get("ROCR_VISIBLE_DEVICES") == kept
    assert env["CUDA_VISIBLE_DEVICES"] == cuda


def test_ray_log_monitor_stays_on() -> None:
    launch = render_all(spec_of("ray-probe"))["scripts/launch.sh"]
    node = node_plan.node_args("10.0.0.1", node_plan.ports("7", 0), 4, 8, "/tmp/r")
    for text in (launch, " ".join(node_plan.head_args(node_plan.ports("7", 0), node, True))):
        assert "--include-log-monitor" not in text
