"""Preflight, cluster choice and live monitoring against the real local Slurm cluster (tools/slurm-dev).

Every preflight error must exit 1 at submit with the fix named, queue nothing (squeue and sacct know no job of that
name afterwards) and write no run directory. With the conditions met, `submit recipe=tiny-gsm8k` with no cluster=
picks slurm-dev from Slurm's ClusterName, trains, and shows a moving progress bar; fake WANDB_API_KEY/HF_TOKEN values
in its environment appear nowhere in the run directory (Slurm's output files included). `status --gpus` runs
nvidia-smi on both nodes of a 2-node job: the one stand-in here is nvidia-smi itself (there are no GPUs), a small
script on the PATH that srun carries into the job step; it prints one row per GPU Slurm gave the step.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import sys

import pytest

from hpc_grpo.runstate import runs
from hpc_grpo.cluster import slurm
from tests.slurm.test_submit import GSM8K, TINY, TRAIN_DEADLINE_S, Env, jobs_named, last_job, make_env
from tests.slurm.jobs import wait_final

pytestmark = [pytest.mark.slurm, pytest.mark.usefixtures("slurm_cluster")]

CLI = [sys.executable, "-m", "hpc_grpo.cli.app"]
# The watched run: enough steps for the bar to move between two `status` calls (a step took 0.7-1.2 s at load
# average 7, a `status` 1-2 s) at half the demo's batch (4 prompts x 4 completions, 32 tokens: the length hint's
# limit kept).
WATCHED_STEPS = 12
WATCHED = [f"train.total_training_steps={WATCHED_STEPS}", "batch.train=4", "batch.mini=4", "batch.micro_per_gpu=4",
           "batch.log_prob_micro_per_gpu=4"]
SECRETS = {"WANDB_API_KEY": "fake-wandb-key-6f1d2c9a7e", "HF_TOKEN": "hf_fakeToken8b3e51d0c4"}
FAKE_NVIDIA_SMI = """#!/bin/bash
# Stand-in for nvidia-smi (no GPUs here): answers --query-gpu=index,name,utilization.gpu,memory.used,memory.total
# --format=csv,noheader,nounits with one row per GPU in CUDA_VISIBLE_DEVICES, as the real one lists the GPUs it sees.
case "$*" in
  *--query-gpu=index,name,utilization.gpu,memory.used,memory.total*) ;;
  *) echo "fake nvidia-smi: unsupported arguments: $*" >&2; exit 2 ;;
esac
[ -n "${CUDA_VISIBLE_DEVICES:-}" ] || { echo "No devices were found" >&2; exit 6; }
IFS=, read -ra gpus <<< "$CUDA_VISIBLE_DEVICES"
for i in "${gpus[@]}"; do
  echo "$i, Fake A100-SXM4-80GB, $(( (i * 37 + 11) % 100 )), $(( 1000 + i * 100 )), 81920"
done
"""


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Env:
    from hpc_grpo.data.gsm8k import prepare_gsm8k

    # ../shared beside the checkout; a git worktree under <root>/wt/ finds it beside <root>
    gsm8k = next((p for p in (GSM8K, Path(__file__).resolve().parents[4] / "shared" / "data" / "gsm8k") if p.is_dir()),
                 GSM8K)
    e = make_env(tmp_path_factory.mktemp("preflight"))
    e.env["COLUMNS"] = "400"  # rich folds long table cells mid-word otherwise
    e.env.pop("HPC_GRPO_CLUSTER", None)
    e.env.pop("XDG_CONFIG_HOME", None)
    data = prepare_gsm8k(gsm8k, e.root / "data")
    small = {}  # the first 64 rows: the job tokenizes every prompt at start, 7473 of them cost a minute under load
    for split, path in (("train", data.trl_train), ("test", data.trl_test)):
        small[split] = e.root / "data" / f"{split}-64.jsonl"
        small[split].write_text("".join(Path(path).read_text().splitlines(keepends=True)[:64]))
    e.tiny = ["recipe=tiny-gsm8k", f"data.train_files={small['train']}", f"data.val_files={small['test']}",
              f"model.path={e.root / 'models' / 'tiny-qwen2'}", *TINY]
    return e


def sacct_named(name: str) -> list[str]:
    proc = subprocess.run(["sacct", "-n", "-X", "-P", "--name", name, "-o", "JobID", "-S", "now-1hour"],
                          capture_output=True, text=True, timeout=30, check=True)
    return proc.stdout.split()


def model_without_tokenizer(root: Path) -> Path:
    folder = root / "half-model"
    folder.mkdir(exist_ok=True)
    (folder / "config.json").write_text(json.dumps({"model_type": "qwen2", "hidden_size": 64, "num_attention_heads": 4,
                                                    "num_key_value_heads": 2, "num_hidden_layers": 2,
                                                    "intermediate_size": 128, "vocab_size": 1000}))
    return folder


# (recipe args, extra overrides, words the refusal must contain, words of the fix)
CASES = {
    "time-over-maxtime": (["recipe=ray-probe", "resources.time=03:00:00", "cluster.time_max=04:00:00"],
                          "partition low allows 120 min (MaxTime)", "resources.time<=120"),
    "gpus-over-gres": (["recipe=ray-probe", "resources.gpus_per_node=5", "cluster.gpus_per_node=8"],
                       "5 GPUs per node asked; partition low nodes have 4 (GRES)", "resources.gpus_per_node<=4"),
    "memory-over-node": (["recipe=ray-probe", "resources.mem_gb=8", "cluster.mem_per_node_gb=16"],
                         "8 GB per node asked; partition low nodes have 4000 MB", "resources.mem_gb<=3"),
    "unknown-account": (["recipe=ray-probe", "resources.account=nosuchacct"],
                        "account 'nosuchacct' is not one of user", "resources.account=root"),
    "unknown-qos": (["recipe=ray-probe", "resources.qos=nosuchqos"], "qos 'nosuchqos' is not allowed",
                    "resources.qos=normal"),
    "no-node-matches": (["recipe=ray-probe", "cluster.gpu_type=h100"],
                        "sbatch --test-only says Requested node configuration is not available", "sinfo -N"),
}


@pytest.mark.parametrize("case", list(CASES) + ["missing-data", "node-local-root", "model-no-tokenizer"])
def test_preflight_error_exits_1_and_queues_nothing(env: Env, case: str) -> None:
    name = env.name(f"pf-{case}")
    if case == "missing-data":
        args, refusal, fix = ([*env.tiny, f"data.train_files={env.root / 'no-such.jsonl'}"], "no-such.jsonl does not "
                              "exist here", "hpc-grpo data --help")
    elif case == "node-local-root":
        local_root = Path("/var/tmp") / f"hpc-grpo-{name}"
        args, refusal, fix = (["recipe=ray-probe", "resources.nodes=2", f"cluster.runs_root={local_root}"],
                              f"runs root {local_root} is under the node-local /var/tmp", "under a shared filesystem")
    elif case == "model-no-tokenizer":
        args, refusal, fix = ([*env.tiny, f"model.path={model_without_tokenizer(env.root)}"], "has no tokenizer files",
                              "copy the model's tokenizer")
    else:
        args, refusal, fix = CASES[case]
    before = (jobs_named(name), sacct_named(name))
    proc = env.submit(*args, "--name", name)
    text = " ".join((proc.stdout + proc.stderr).split())  # rich wraps table cells
    assert proc.returncode == 1, text
    assert "Nothing submitted" in text
    assert all(w in text for w in refusal.split()), (refusal, text)
    assert all(w in text for w in fix.split()), (fix, text)
    assert before == ([], []) and jobs_named(name) == [] and sacct_named(name) == []
    assert not (env.runs_root / name).exists()
    if case == "node-local-root":
        assert not local_root.exists()


def test_submit_without_cluster_picks_slurm_dev_and_keeps_secrets(env: Env) -> None:
    name = env.name("pf-pick")
    secret_env = {**env.env, **SECRETS}
    # health.length_limit_by_design=false: the demo declares its length limit a design, which silences the hint
    # this test checks against the responses' real length below
    proc = subprocess.run([*CLI, "submit", *env.tiny, *WATCHED,
                           "health.length_limit_by_design=false",
                           f"cluster.runs_root={env.runs_root}", "--name", name, "--no-wait"], capture_output=True,
                          text=True, env=secret_env, cwd=env.root, timeout=180, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "cluster: slurm-dev (this machine's Slurm is ClusterName=hpcgrpo-dev, the slurm_cluster_name of profile " \
           "slurm-dev)" in " ".join(proc.stderr.split())
    run_dir = env.runs_root / name
    job = last_job(run_dir)
    # The job's progress is watched through the metrics file and squeue (cheap); the CLI's status view (a Python
    # process each: seconds of CPU under load) is asked only when a new step shows, a few times, to see the bar move.
    from tests.slurm.test_signals import metric_rows

    steps, bars = set(), []
    end = time.monotonic() + 2 * TRAIN_DEADLINE_S  # ~20 s on an idle machine; a step took 90 s under load 40
    while time.monotonic() < end:
        rows = metric_rows(run_dir)
        step = rows[-1]["step"] if rows else None
        if step is not None and step not in steps and len(set(bars)) < 3:
            steps.add(step)
            text = env.cli("status", str(run_dir)).stdout
            bars += [ln for ln in text.splitlines() if ln.startswith("Progress: [")]
        info = slurm.job_states([job]).get(job)
        if info is not None and not info.live:
            break
        time.sleep(0.5)
    info = wait_final(job, 60)
    assert info.state == "COMPLETED", info
    print("progress lines seen:", *dict.fromkeys(bars), sep="\n  ")
    assert len(steps) >= 2, steps  # the bar moved while the job ran
    assert len(set(bars)) >= 2, bars
    final = env.status(run_dir)["monitor"]
    assert final["progress"]["step"] == WATCHED_STEPS and final["progress"]["total"] == WATCHED_STEPS
    assert final["progress"]["step_time_s"] and final["progress"]["step_time_s"] > 0
    assert {"reward", "kl", "grad_norm", "response_length"} <= set(final["latest"])
    assert final["progress"]["requeues"] == 0
    # the length hint appears exactly when the latest mean response length is at the 32-token limit (the monitor's
    # share of it: a policy that learned to fill its answers sits at 31-32 tokens)
    from hpc_grpo.commands.monitor import AT_LIMIT_SHARE

    at_limit = final["latest"]["response_length"] >= AT_LIMIT_SHARE * 32
    assert any("data.max_response_length=32" in h for h in final["hints"]) == at_limit, final
    shown = env.cli("status", str(run_dir)).stdout
    assert f"[{'#' * 30}] {WATCHED_STEPS}/{WATCHED_STEPS} 100%" in shown and f"Latest (step {WATCHED_STEPS})" in shown
    log = env.cli("logs", str(run_dir))
    assert log.returncode == 0 and f"step {WATCHED_STEPS}/{WATCHED_STEPS}" in log.stdout, log.stdout[-2000:] + log.stderr
    leaked = [str(p) for p in run_dir.rglob("*") if p.is_file()
              and any(v.encode() in p.read_bytes() for v in SECRETS.values())]
    assert leaked == []
    assert (run_dir / "submitit" / f"{job}_0_log.out").is_file()  # Slurm's output files were among those read


def test_gpus_shows_one_row_per_gpu_of_a_two_node_job(env: Env) -> None:
    fake_bin = env.root / "fake-bin"
    fake_bin.mkdir(exist_ok=True)
    (fake_bin / "nvidia-smi").write_text(FAKE_NVIDIA_SMI)
    (fake_bin / "nvidia-smi").chmod(0o755)
    name = env.name("pf-gpus")
    proc = env.submit("recipe=ray-probe", "resources.nodes=2", "launch.driver=[python3,-m,hpc_grpo.job.ray_probe,"
                      "--sleep=90]", "--name", name)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    run_dir = env.runs_root / name
    job = last_job(run_dir)
    try:
        end = time.monotonic() + 240
        while (info := slurm.job_states([job]).get(job)) is None or info.state != "RUNNING":
            assert time.monotonic() < end, info
            assert info is None or info.live, info
            time.sleep(0.5)
        gpu_env = {**env.env, "PATH": f"{fake_bin}{os.pathsep}{env.env['PATH']}"}
        shown = subprocess.run([*CLI, "status", str(run_dir), "--gpus", "--json"], capture_output=True,
                               text=True, env=gpu_env, cwd=env.root, timeout=120, check=False)
        assert shown.returncode == 0, shown.stdout + shown.stderr
        rows = json.loads(shown.stdout)["gpus"]["rows"]
        nodes = slurm.job_states([job])[job].nodelist
        print(f"job {job} on {nodes}:", *(f"{r['node']} GPU {r['index']} {r['util_pct']:.0f}%" for r in rows))
        assert len(rows) == 8
        assert len({r["node"] for r in rows}) == 2
        assert sorted(r["index"] for r in rows) == [0, 0, 1, 1, 2, 2, 3, 3]
        assert all(r["mem_total_mib"] == 81920 for r in rows)
        table = subprocess.run([*CLI, "status", str(run_dir), "--gpus"], capture_output=True, text=True,
                               env={**gpu_env, "COLUMNS": "200"}, cwd=env.root, timeout=120, check=False)
        assert table.returncode == 0 and f"GPUs of job {job}" in table.stdout, table.stdout + table.stderr
        assert "hint:" in table.stdout and "under 50% busy" in table.stdout  # the stand-in reports some idle GPUs
        assert runs.read_history(run_dir)[-1].job_id == job
    finally:
        slurm.cancel(job)
        wait_final(job, 90)
