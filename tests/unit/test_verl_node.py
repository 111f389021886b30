"""One node of a verl job (hpc_grpo.job.verl_node): its decisions (node_plan), where it is (job_env, slurm's
parsers) and its teardown (proc_tree), without Ray or Slurm. The real runs: tests/slurm/test_multinode.py (2 and 4
Slurm nodes) and tests/local/test_verl_local.py (cluster=local)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from hpc_grpo.cluster import job_env, slurm, slurm_output
from hpc_grpo.config import ray_ports
from hpc_grpo.job import node_plan, proc_tree, verl_node
from hpc_grpo.launch.render import render_all
from hpc_grpo.config.resolve import resolve_spec
from hpc_grpo.common.yamlio import SpecError
from hpc_grpo.runstate import layout
from tests.launch_script import node_argv


@pytest.fixture(autouse=True)
def pinned(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", "/home/user")
    monkeypatch.setenv("USER", "user")
    monkeypatch.delenv("HPC_GRPO_PATH", raising=False)


# ------------------------------------------------------------------------------------------ ports and Ray's arguments
def test_port_blocks_per_job_and_node() -> None:
    assert node_plan.ports("1234", 0) == node_plan.Ports(gcs=20000 + 4 * 400, base=21600)
    assert node_plan.ports(1234, 3).base == 21600 + 300
    assert node_plan.ports(1234, 4).base == 21600  # node 4 is another host: slot 0 again
    # 30 jobs in a row get 30 disjoint blocks, all below the ephemeral range
    blocks = {node_plan.ports(j, 0).gcs for j in range(100, 130)}
    assert len(blocks) == 30 and max(blocks) + node_plan.JOB_BLOCK <= 32768


@pytest.mark.parametrize("index", [0, 1, 2, 3])
def test_every_ray_port_of_a_node_is_inside_its_slot(index: int) -> None:
    p = node_plan.ports("77", index)
    node = node_plan.node_args("127.0.0.12", p, 4, 38, "/tmp/hpc-grpo-ray-77-1")
    argv = node_plan.head_args(p, node, client_server=True) if index == 0 else node_plan.worker_args("a:1", node)
    ports = [int(a.split("=")[1]) for a in argv if a.split("=")[0].endswith("port") and "=" in a and a != f"--port={p.gcs}"]
    assert ports and all(p.base < port < p.base + node_plan.NODE_SLOT for port in ports), argv
    assert "--node-ip-address=127.0.0.12" in argv and "--num-gpus=4" in argv and "--num-cpus=38" in argv
    assert "--temp-dir=/tmp/hpc-grpo-ray-77-1" in argv and argv[-1] == "--block"


def test_head_args() -> None:
    p = node_plan.ports("5", 0)
    node = node_plan.node_args("10.1.1.1", p, 8, 64, node_plan.ray_temp_dir("5", 0))
    with_client = node_plan.head_args(p, node, client_server=True)
    assert with_client[:3] == ["--head", f"--port={p.gcs}", f"--ray-client-server-port={p.base + 7}"]
    assert "--no-monitor" in with_client and "--include-dashboard=false" in with_client
    assert f"--dashboard-port={p.base + 8}" in with_client
    # minimal Ray (no grpc) aborts when given the client-server flag at all
    assert not [a for a in node_plan.head_args(p, node, client_server=False) if "client-server" in a]
    assert node_plan.worker_args("10.1.1.1:22000", node)[0] == "--address=10.1.1.1:22000"
    assert node_plan.ray_temp_dir("5", 0) == "/tmp/hpc-grpo-ray-5-0"


def test_ray_is_started_on_this_interpreter(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[list[str]] = []
    monkeypatch.setattr(subprocess, "Popen", lambda argv, **kw: seen.append(argv))
    verl_node.RayNode("/tmp/x").start(["--wait", "a:1"], ["--address=a:1"])
    assert seen == [[sys.executable, "-m", "hpc_grpo.job.ray_start", "--wait", "a:1", "--", "--address=a:1"]]


# ------------------------------------------------------------------------------------------ environment and driver
def test_node_environment() -> None:
    env = node_plan.node_environ({"RAY_ADDRESS": "elsewhere:6379", "PATH": "/bin", "CUDA_VISIBLE_DEVICES": "0,1",
                                  "ROCR_VISIBLE_DEVICES": "0,1", "WANDB_SERVICE": "3-1-unix-/tmp/wandb-1/socket"})
    assert "RAY_ADDRESS" not in env and "ROCR_VISIBLE_DEVICES" not in env
    assert "WANDB_SERVICE" not in env  # the submitting process's W&B service is not this job's
    assert env["RAY_AUTH_MODE"] == "disabled" and env["RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S"] == "0"
    assert env["PATH"] == "/bin"
    # a user's explicit choice holds for every Ray of the job
    assert node_plan.node_environ({"RAY_AUTH_MODE": "token"})["RAY_AUTH_MODE"] == "token"
    assert node_plan.node_environ({"RAY_AUTH_MODE": ""})["RAY_AUTH_MODE"] == "disabled"


def test_driver_argv_and_environment() -> None:
    driver = ["/py", "-m", "verl.trainer.main_ppo", "x=1"]
    resume = ["trainer.resume_mode=resume_path", "trainer.resume_from_path=/r/checkpoints/global_step_2"]
    assert node_plan.driver_argv(driver, resume, True) == [*driver, *resume]
    assert node_plan.driver_argv(driver, resume, False) == driver  # a custom driver gets none
    env = node_plan.driver_environ({"RAY_AUTH_MODE": "disabled"}, {"WANDB_RUN_ID": "r-1"}, "127.0.0.2:21600")
    assert env == {"RAY_AUTH_MODE": "disabled", "WANDB_RUN_ID": "r-1", "RAY_ADDRESS": "127.0.0.2:21600"}
    assert node_plan.parse_assignments(["A=1", "B=x=y", "C="]) == {"A": "1", "B": "x=y", "C": ""}
    with pytest.raises(ValueError):
        node_plan.parse_assignments(["novalue"])
    assert node_plan.exit_status(0) == 0 and node_plan.exit_status(3) == 3 and node_plan.exit_status(-15) == 143


def test_state_files() -> None:
    files = layout.state_files("/run/ray", "42", 1)
    assert files.done == Path("/run/ray/42/driver-exited.1") and files.joined == Path("/run/ray/42/joined.1")
    assert files.resume_args == Path("/run/ray/42/resume-args.1")
    assert files.workers(3) == [Path("/run/ray/42/stopped.1.1"), Path("/run/ray/42/stopped.1.2")]


# ------------------------------------------------------------------------------------------ the rendered exec line
@pytest.mark.parametrize(("cluster", "local"), [("local", "127.0.0.2"), ("slurm-dev", None)])
def test_launch_script_arguments(cluster: str, local: str | None, tmp_path: Path) -> None:
    spec = resolve_spec("tiny-verl", cluster, ["cluster.runs_root=/runs"], run_name="t", now=0.0)
    launch = render_all(spec)["scripts/launch.sh"]
    o = verl_node.parse_args(node_argv(launch, tmp_path))
    assert o.spec == Path("/runs/t/spec.yaml") and o.run_dir == Path("/runs/t") and o.ray_dir == Path("/runs/t/ray")
    assert o.local_address == local and o.resume and o.nodes == spec.recipe.resources.nodes
    assert o.driver[:3] == [spec.python, "-m", "verl.trainer.main_ppo"]
    assert o.driver_env == {"WANDB_RUN_ID": "t-" + o.driver_env["WANDB_RUN_ID"].split("-")[-1], "WANDB_RESUME": "allow"}
    assert len(launch.split("driver=(")[0].splitlines()) < 80
    assert o.ray_ports == ray_ports.parse(spec.cluster.ray_ports)


def test_local_and_slurm_dev_ray_ports_never_meet() -> None:
    """The local profile's jobs and slurm-dev's nodes run on one machine (and CI runs both at once): every block
    either profile can give a job lies outside every block of the other."""
    def ports_of(cluster: str) -> set[int]:
        allowed = ray_ports.parse(resolve_spec("tiny-verl", cluster, [], run_name="t").cluster.ray_ports)
        return {port for job in range(allowed.blocks) for port in range(node_plan.ports(job, 0, allowed).gcs,
                                                                         node_plan.ports(job, 0, allowed).gcs + 400)}
    local, dev = ports_of("local"), ports_of("slurm-dev")
    assert local and dev and not local & dev
    allowed = ray_ports.parse("12000-19999")
    assert allowed.blocks == 20 and {node_plan.ports(j, 0, allowed).gcs for j in range(20)} == set(range(12000, 20000, 400))


@pytest.mark.parametrize(("value", "rule"), [("20000:30000", "FIRST-LAST"), ("30000-20000", "rise"), ("80-1000", "rise"),
                                             ("20000-20100", "block of 400")])
def test_a_bad_ray_port_range_is_refused_naming_the_rule(value: str, rule: str) -> None:
    with pytest.raises(SpecError, match=rule):
        resolve_spec("tiny-verl", "local", [f"cluster.ray_ports={value}"], run_name="t")


def test_the_joined_line_names_gpus_only_where_there_are_gpus(isolated: Path) -> None:
    """verl's CPU mode gives Ray one stand-in GPU per CPU worker: the job log says CPU workers, not GPUs."""
    from hpc_grpo.launch.render import write_files

    for recipe, cluster, unit in (("tiny-verl", "local", "CPU worker(s), no GPU (verl's CPU mode)"),
                                  ("qwen2.5-3b-gsm8k-lora", "a100-ib", "GPU(s)")):
        spec = resolve_spec(recipe, cluster, [f"cluster.runs_root={isolated}"], run_name=recipe)
        write_files(spec.path, render_all(spec))
        assert verl_node.gpu_unit(layout.spec_file(spec.path)) == unit
    assert verl_node.gpu_unit(isolated / "missing" / "spec.yaml") == "GPU(s)"


def test_local_address_is_a_loopback_other_than_127_0_0_1() -> None:
    assert resolve_spec("tiny-verl", "local", ["cluster.local_address=127.0.0.9"], run_name="t").cluster.local_address \
        == "127.0.0.9"
    for bad in ("127.0.0.1", "10.0.0.2", "localhost"):
        with pytest.raises(SpecError):
            resolve_spec("tiny-verl", "local", [f"cluster.local_address={bad}"], run_name="t")


# ------------------------------------------------------------------------------------------ where the node is
SCONTROL_O = (
    "NodeName=node1 Arch=x86_64 CoresPerSocket=1 CPUAlloc=2 Gres=gpu:4 NodeAddr=127.0.0.11 NodeHostName=localhost\n"
    "NodeName=node3 Arch=x86_64 NodeAddr=127.0.0.13 NodeHostName=localhost Port=17003\n"
    "NodeName=node9 Arch=x86_64 State=DOWN\n"
)


def test_parse_node_addrs() -> None:
    assert slurm_output.parse_node_addrs(SCONTROL_O) == {"node1": "127.0.0.11", "node3": "127.0.0.13"}


def test_slurm_layout(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(slurm, "hostnames", lambda nodelist: ["node1", "node3"] if nodelist == "node[1,3]" else [])
    monkeypatch.setattr(slurm, "node_addresses", lambda names: slurm_output.parse_node_addrs(SCONTROL_O))
    env = {"SLURM_JOB_ID": "31", "SLURM_NODEID": "1", "SLURMD_NODENAME": "node3", "SLURM_JOB_NODELIST": "node[1,3]",
           "SLURM_RESTART_COUNT": "2"}
    lay = job_env.node_layout(2, None, env)
    assert (lay.job_id, lay.executor, lay.attempt, lay.index, lay.name) == ("31", "slurm", 2, 1, "node3")
    assert lay.address == "127.0.0.13" and lay.head_address == "127.0.0.11"
    with pytest.raises(job_env.JobEnvError, match="expected 4 nodes"):
        job_env.node_layout(4, None, env)
    with pytest.raises(job_env.JobEnvError, match="SLURM_JOB_ID"):
        job_env.node_layout(2, None, {})  # no Slurm and not rendered for cluster=local


def test_local_layout() -> None:
    lay = job_env.node_layout(1, "127.0.0.2", {"SUBMITIT_LOCAL_JOB_ID": "4321"})
    assert (lay.job_id, lay.executor, lay.attempt, lay.index) == ("4321", "local", 0, 0)
    assert lay.address == lay.head_address == "127.0.0.2"
    assert job_env.job_identity({}) [1] == "local"  # no submitit either: this process's pid
    with pytest.raises(job_env.JobEnvError):
        job_env.node_layout(2, "127.0.0.2", {})


# ------------------------------------------------------------------------------------------ teardown
def test_parse_stat_and_descendants() -> None:
    line = "4711 (ray::Some (odd) name) S 4700 4711 4711 0 -1 4194560 " + " ".join(["0"] * 12) + " 987654 0 0"  # field 22
    assert proc_tree.parse_stat(line) == proc_tree.Stat("S", 4700, 987654)
    table = [(1, 0), (10, 1), (11, 10), (12, 10), (13, 12), (20, 1)]
    assert proc_tree.descendants(10, table) == [11, 12, 13]
    # a pid reused by another process (other start time) is not the one recorded
    assert proc_tree.still_there({11: 5, 12: 6}, probe={11: 5, 12: 7}.get) == [11]


def test_stop_tree_kills_what_outlives_its_parent_and_nothing_else() -> None:
    """Like Ray's agents: a grandchild that ignores SIGTERM outlives its parent and is killed by pid + start time;
    an unrelated process (started beside, not below) is left alone."""
    beside = subprocess.Popen(["sleep", "60"])
    proc = subprocess.Popen(["bash", "-c", "(trap '' TERM; exec sleep 60) & wait"])
    try:
        end = time.monotonic() + 10
        while not (tree := proc_tree.snapshot(proc.pid)) and time.monotonic() < end:
            time.sleep(0.05)
        assert tree, "the grandchild did not start"
        said: list[str] = []
        proc_tree.stop_tree(proc, grace_s=0.5, log=said.append)
        end = time.monotonic() + 5
        while proc_tree.still_there(tree) and time.monotonic() < end:
            time.sleep(0.05)
        assert not proc_tree.still_there(tree)
        assert said and said[0].startswith("killing 1 process(es)")
        assert beside.poll() is None
    finally:
        beside.kill()
        beside.wait()
