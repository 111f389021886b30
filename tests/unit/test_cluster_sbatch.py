"""hpc_grpo.cluster.sbatch (what a job asks Slurm for, from names and numbers) and hpc_grpo.cluster.states (the one
map from Slurm's job states to restart causes). The rendered scripts themselves are pinned by test_golden.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpc_grpo.cluster import sbatch, states
from hpc_grpo.runstate import restart


def logs(folder: Path, task: str = "0") -> tuple[str, str]:
    return f"{folder}/%j_{task}_log.out", f"{folder}/%j_{task}_log.err"


def request(**changes: object) -> sbatch.Request:
    base = dict(job_name="r", nodes=2, gpus_per_node=4, gpu_type="a100", gpu_request="gres", cpus_per_task=16,
                mem_gb=64, time_min=90, partition="gpu", account=None, qos="high", signal_delay_s=120)
    return sbatch.Request(**{**base, **changes})  # type: ignore[arg-type]


def test_options_in_script_order(tmp_path: Path) -> None:
    opts = sbatch.options(request(), logs(tmp_path), extra=sbatch.follow_on("77"))
    keys = [k for k, _ in opts]
    assert keys == ["job-name", "nodes", "ntasks-per-node", "gres", "cpus-per-task", "mem", "time", "partition", "qos",
                    "signal", "dependency", "kill-on-invalid-dep", "output", "error", "open-mode"]
    values = dict(opts)
    assert values["gres"] == "gpu:a100:4" and values["mem"] == "64G" and values["time"] == 90
    assert values["signal"] == "USR2@120" and values["dependency"] == "afternotok:77"
    assert (values["output"], values["error"]) == logs(tmp_path)


@pytest.mark.parametrize(("changes", "expected"), [
    ({"gpu_request": "gpus-per-node"}, ("gpus-per-node", "a100:4")),
    ({"gpu_request": "gpus-per-node", "gpu_type": None}, ("gpus-per-node", 4)),
    ({"gpu_type": None}, ("gres", "gpu:4")),
])
def test_gpus_asked_the_way_the_cluster_wants(tmp_path: Path, changes: dict, expected: tuple) -> None:
    assert expected in sbatch.options(request(**changes), logs(tmp_path))


def test_no_gpus_no_memory_no_gpu_line(tmp_path: Path) -> None:
    keys = [k for k, _ in sbatch.options(request(gpus_per_node=0, mem_gb=None), logs(tmp_path))]
    assert not {"gres", "gpus-per-node", "mem"} & set(keys)


def test_dependencies_and_requeue_mode(tmp_path: Path) -> None:
    assert sbatch.dependency(sbatch.AFTER_ANY, "12") == "afterany:12"
    assert sbatch.requeue_mode(True, chained=False) == {"requeue": True, "no_requeue": False}
    assert sbatch.requeue_mode(True, chained=True) == {"requeue": False, "no_requeue": True}  # ends PREEMPTED
    assert sbatch.srun_args(logs(tmp_path, "%t"), "img.sqsh", "/runs/r:/runs/r")[-4:] == [
        "--kill-on-bad-exit=1", "--container-image=img.sqsh", "--container-mounts=/runs/r:/runs/r",
        "--no-container-mount-home"]
    # a launcher gets pyxis's options, then `--` before the task's command; without a container, neither
    launched = sbatch.srun_args(logs(tmp_path, "%t"), "img.sqsh", "/d:/d:ro", "/opt/launch")
    assert launched[-5:] == ["/opt/launch", "--container-image=img.sqsh", "--container-mounts=/d:/d:ro",
                             "--no-container-mount-home", "--"]
    assert not any("container" in a for a in sbatch.srun_args(logs(tmp_path, "%t"), None, "", "/opt/launch"))


def test_one_state_to_cause_map() -> None:
    """status's restart causes, the requeue decision's causes and the chained follow-on's come from one map."""
    resumable = {s: states.resumable_cause(s) for s in ("TIMEOUT", "PREEMPTED", "NODE_FAIL")}
    assert resumable == {"TIMEOUT": restart.TIME_LIMIT, "PREEMPTED": restart.PREEMPTION,
                         "NODE_FAIL": restart.NODE_FAILURE}
    assert all(states.RESTART_CAUSES[s] == cause for s, cause in resumable.items())
    for final in ("COMPLETED", "FAILED", "CANCELLED", "OUT_OF_MEMORY", "REQUEUED", "BOOT_FAIL", "UNKNOWN"):
        assert states.resumable_cause(final) is None, final
    assert restart.chained_start("OUT_OF_MEMORY", 0, 3).requeue is False
    assert restart.chained_start("NODE_FAIL", 9, 0).requeue is True  # node failures never count


def test_request_takes_the_recipe_first_then_the_profile(isolated: Path) -> None:
    from hpc_grpo.config.resolve import resolve_spec

    base = resolve_spec("tiny-gsm8k", "slurm-dev", ["resources.cpus_per_task=null"], run_name="t")
    req = sbatch.request(base)
    assert base.recipe.resources.cpus_per_task is None and base.recipe.resources.partition is None
    assert (req.cpus_per_task, req.partition, req.nodes) == (base.cluster.cpus_per_node, base.cluster.partition, 1)
    asked = sbatch.request(resolve_spec("tiny-gsm8k", "slurm-dev", ["resources.partition=high",
                                                                     "resources.cpus_per_task=3"], run_name="t"))
    assert (asked.partition, asked.cpus_per_task, asked.job_name) == ("high", 3, "t")
