"""hpc_grpo.cluster.slurm and submitit against the real local cluster (tools/slurm-dev): no mocks."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from hpc_grpo.cluster import slurm, states
from tests.slurm.jobs import wait_final

pytestmark = [pytest.mark.slurm, pytest.mark.usefixtures("slurm_cluster")]

DEADLINE_S = 30.0


def sbatch(script: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["sbatch", "--parsable", *args, str(script)],
        capture_output=True,
        text=True,
        timeout=20,
        cwd=script.parent,
        check=False,
    )


def submit(tmp_path: Path, body: str, *args: str, name: str = "job.sh") -> tuple[str, Path]:
    script = tmp_path / name
    script.write_text(f"#!/bin/bash\n{body}\n")
    out = tmp_path / f"{name}.out"
    proc = sbatch(script, f"--output={out}", *args)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip().split(";")[0], out


def test_available() -> None:
    assert slurm.available()


def test_partition_limits_low() -> None:
    lim = slurm.partition_limits("low")
    assert (lim.name, lim.nodes, lim.gpus_per_node, lim.cpus_per_node) == ("low", 4, 4, 4)
    assert lim.mem_per_node_mb == 4000
    assert lim.max_time_min == 120
    assert slurm.partition_limits(None).name == "low"  # the default partition


def test_partition_limits_unknown_partition() -> None:
    with pytest.raises(slurm.SlurmError, match="no partition 'nope'"):
        slurm.partition_limits("nope")


def test_sbatch_reaches_completed(tmp_path: Path) -> None:
    t0 = time.monotonic()
    job_id, out = submit(tmp_path, "echo hello")
    info = wait_final(job_id, DEADLINE_S)
    took = time.monotonic() - t0
    print(f"sbatch -> {info.state} in {took:.2f}s")
    assert info.state == "COMPLETED", info
    assert info.exit_code == "0:0"
    assert info.nodelist == "node1"
    assert out.read_text().strip() == "hello"


def test_failed_job_exit_code(tmp_path: Path) -> None:
    job_id, _ = submit(tmp_path, "exit 3")
    info = wait_final(job_id, DEADLINE_S)
    assert (info.state, info.exit_code) == ("FAILED", "3:0")


def test_two_nodes_layout_and_gpus(tmp_path: Path) -> None:
    body = "srun bash -c 'echo \"$SLURM_PROCID $SLURMD_NODENAME $SLURM_NODELIST $CUDA_VISIBLE_DEVICES\"'"
    job_id, out = submit(tmp_path, body, "-N", "2", "--ntasks-per-node=1", "--gpus-per-node=2")
    info = wait_final(job_id, DEADLINE_S)
    assert info.state == "COMPLETED", (info, out.read_text())
    assert info.nodelist == "node[1-2]"
    lines = sorted(out.read_text().split("\n"))
    assert [ln for ln in lines if ln] == ["0 node1 node[1-2] 0,1", "1 node2 node[1-2] 0,1"]


def test_impossible_request_refused_at_submit(tmp_path: Path) -> None:
    script = tmp_path / "big.sh"
    script.write_text("#!/bin/bash\ntrue\n")
    proc = sbatch(script, "-N", "5")
    assert proc.returncode != 0
    assert "Node count specification invalid" in proc.stderr


def test_batch_script_roundtrip(tmp_path: Path) -> None:
    text = "#!/bin/bash\n#SBATCH --job-name=roundtrip\necho 'quoted $x'\nsleep 0\n"
    script = tmp_path / "rt.sh"
    script.write_text(text)
    proc = sbatch(script, f"--output={tmp_path}/rt.out")
    assert proc.returncode == 0, proc.stderr
    job_id = proc.stdout.strip()
    assert slurm.batch_script(job_id) == text
    wait_final(job_id, DEADLINE_S)


def test_batch_script_unknown_job() -> None:
    with pytest.raises(slurm.SlurmError, match="Invalid job id"):
        slurm.batch_script("99999999")


def test_cancel_and_unknown_ids(tmp_path: Path) -> None:
    job_id, _ = submit(tmp_path, "sleep 60")
    assert slurm.job_states([job_id])[job_id].live
    slurm.cancel(job_id)
    info = wait_final(job_id, DEADLINE_S)
    assert info.state == "CANCELLED" and not states.is_live(info.state)
    assert slurm.job_states(["99999999"]) == {}
    slurm.cancel(job_id)  # already ended: not an error


def test_sacct_fallback_for_finished_job(tmp_path: Path) -> None:
    job_id, _ = submit(tmp_path, "exit 0")
    wait_final(job_id, DEADLINE_S)
    # squeue keeps a finished job for MinJobAge (120 s); ask accounting directly, as job_states does afterwards.
    end = time.monotonic() + DEADLINE_S
    while (info := slurm.sacct_states([job_id]).get(job_id)) is None or info.live:
        assert time.monotonic() < end, f"sacct never reported job {job_id} finished: {info}"
        time.sleep(0.3)
    assert (info.source, info.state, info.exit_code, info.nodelist) == ("sacct", "COMPLETED", "0:0", "node1")
    # a job neither squeue nor sacct knows is absent, not an error
    assert slurm.sacct_states(["99999999"]) == {}


def test_submitit_returns_42(tmp_path: Path) -> None:
    submitit = pytest.importorskip("submitit")

    def answer() -> int:  # nested: cloudpickle ships it by value, the job needs no import of this file
        return 6 * 7

    ex = submitit.AutoExecutor(folder=tmp_path / "submitit", cluster="slurm")
    ex.update_parameters(timeout_min=5, slurm_partition="low", nodes=1, tasks_per_node=1, cpus_per_task=1)
    job = ex.submit(answer)
    end = time.monotonic() + 45
    while job.state not in {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL"}:
        assert time.monotonic() < end, f"submitit job {job.job_id} still {job.state}"
        time.sleep(0.5)
    assert job.state == "COMPLETED", job.stderr()
    assert job.result() == 42
