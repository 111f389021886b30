"""The evaluation chained after training on the real local Slurm cluster, and lm-eval run by hand agreeing with it.

tiny-gsm8k trains 2 steps (trl, CPU) as a Slurm job; submit queues the evaluation job through submitit with
`--dependency=afterany:<training job>` and its own resources (eval.resources: 2 CPUs, no GPU). The test watches the
evaluation wait on the dependency while training runs, both end COMPLETED, RUN/eval/step_2.json holds strict and
flexible scores on 5 GSM8K test problems, and the `lm_eval` CLI run by hand on the same export with the same local
task gives the same numbers and the same generations. No stand-ins.

afterany, not afterok: the eval job decides itself whether the run is trained (hpc_grpo.runstate.trained). Two more runs
check that decision on real jobs: one whose training job fails after its final save (as after a W&B
teardown error; here the final train_done.json write fails because that path is a folder) is evaluated and
`status` says "trained ... then failed"; one cancelled mid-training is not evaluated, and its eval job ends at
once instead of waiting forever on a dependency that can never be met (what afterok did).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hpc_grpo.runstate import runs
from hpc_grpo.cluster import slurm
from hpc_grpo.runstate import layout
from tests.slurm.jobs import wait_final
from tests.slurm.test_submit import GSM8K, Env, make_env

pytestmark = [pytest.mark.slurm, pytest.mark.usefixtures("slurm_cluster")]

DEADLINE_S = 600.0  # train (~1 min) + two lm-eval runs (~1 min each) on 2 shared cores; room for a busy queue
LIMIT = 5


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Env:
    from hpc_grpo.data.gsm8k import prepare_gsm8k

    e = make_env(tmp_path_factory.mktemp("evalchain"))
    data = prepare_gsm8k(GSM8K, e.root / "data")
    e.env.update(HF_HOME=str(e.root / "hf"), HF_DATASETS_OFFLINE="1")
    e.tiny = ["recipe=tiny-gsm8k", f"data.train_files={data.trl_train}", f"data.val_files={data.trl_test}",
              f"model.path={e.root / 'models' / 'tiny-qwen2'}", "train.total_training_steps=2",
              "checkpoint.save_freq=2", f"eval.limit={LIMIT}"]
    return e


def test_eval_job_runs_after_training_and_lm_eval_by_hand_agrees(env: Env) -> None:
    name = env.name("evalchain")
    proc = env.submit(*env.tiny, "--name", name)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    run_dir = env.runs_root / name
    history = runs.read_history(run_dir)
    assert [e.purpose for e in history] == ["train", "eval"], history
    train_id, eval_id = history[0].job_id, history[1].job_id
    assert history[1].note == f"afterany:{train_id}"
    script = slurm.batch_script(eval_id)
    assert f"#SBATCH --dependency=afterany:{train_id}" in script
    assert "#SBATCH --cpus-per-task=2" in script and "--gpus-per-node" not in script  # eval.resources, not train's

    # While training is queued or running, the evaluation waits on its dependency.
    end = time.monotonic() + DEADLINE_S
    saw_dependency = False
    while True:
        states = slurm.job_states([train_id, eval_id])
        if states[train_id].live:
            assert states[eval_id].state == "PENDING", states
            saw_dependency |= states[eval_id].reason == "Dependency"
        else:
            break
        assert time.monotonic() < end, f"training not finished after {DEADLINE_S}s: {states}"
        time.sleep(0.5)
    assert saw_dependency, "the eval job never showed reason=Dependency while training ran"
    assert wait_final(train_id, 10).state == "COMPLETED"
    info = wait_final(eval_id, max(60.0, end - time.monotonic()))
    log = run_dir / "submitit" / f"{eval_id}_0_log.err"
    assert info.state == "COMPLETED", (info, log.read_text() if log.exists() else "")

    result = json.loads((run_dir / "eval" / "step_2.json").read_text())
    gsm = result["scores"]["gsm8k"]
    assert result["step"] == 2 and result["export"] == str(run_dir / "exports" / "step_2")
    assert gsm["n"] == LIMIT and len(gsm["samples"]) == LIMIT
    assert 0.0 <= gsm["strict_match"] <= 1.0 and 0.0 <= gsm["flexible_extract"] <= 1.0
    assert result["base"]["scores"]["gsm8k"]["n"] == LIMIT
    assert result["metrics"]["gsm8k/strict_match"] == gsm["strict_match"]
    assert result["wall_time_s"] > 0 and result["problems_per_s"] > 0

    # lm-eval by hand: its own CLI, the same export and task folder.
    cli = result["lm_eval_cli"]
    out = env.root / "by-hand"
    lm_eval = str(Path(sys.executable).parent / "lm_eval")  # the venv's console script
    by_hand = subprocess.run([lm_eval, *cli[1:], "--output_path", str(out)], capture_output=True, text=True,
                             env={**env.env, "HF_HUB_OFFLINE": "1"}, cwd=env.root, timeout=300, check=False)
    assert by_hand.returncode == 0, by_hand.stdout[-3000:] + by_hand.stderr[-3000:]
    results_file = next(out.rglob("results_*.json"))
    mine = json.loads(results_file.read_text())["results"]["hpc_grpo_gsm8k"]
    assert mine["exact_match,strict-match"] == gsm["strict_match"]
    assert mine["exact_match,flexible-extract"] == gsm["flexible_extract"]
    samples_file = next(out.rglob("samples_hpc_grpo_gsm8k_*.jsonl"))
    rows = [json.loads(line) for line in samples_file.read_text().splitlines() if line.strip()]
    by_doc = {r["doc_id"]: r["resps"][0][0] for r in rows}
    assert {s["doc_id"]: s["completion"] for s in gsm["samples"]} == by_doc


def eval_log(run_dir: Path, job_id: str) -> str:
    return "\n".join(p.read_text(errors="replace") for p in (run_dir / "submitit").glob(f"{job_id}_0_log.*"))


def test_a_job_that_fails_after_its_final_save_counts_as_trained(env: Env) -> None:
    name = env.name("failafter")
    proc = env.submit(*env.tiny, "eval.limit=2", "--name", name)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    run_dir = env.runs_root / name
    # The job's last act is writing train_done.json; a folder in its place makes that write fail after the final
    # checkpoint is on disk (the job takes seconds to start: this lands first).
    (run_dir / layout.DONE_FILE).mkdir()
    train_id, eval_id = runs.last_job_id(run_dir), runs.last_job_id(run_dir, "eval")
    train = wait_final(train_id, DEADLINE_S)
    assert train.state == "FAILED", (train, eval_log(run_dir, train_id)[-3000:])
    info = wait_final(eval_id, DEADLINE_S)
    assert info.state == "COMPLETED", (info, eval_log(run_dir, eval_id)[-3000:])
    assert "is trained: final checkpoint step 2 written" in eval_log(run_dir, eval_id)
    result = json.loads((run_dir / "eval" / "step_2.json").read_text())
    assert result["step"] == 2 and result["scores"]["gsm8k"]["n"] == 2
    st = env.status(run_dir)
    assert st["trained"].startswith("trained (final checkpoint step 2 written; the job then failed"), st["trained"]
    assert not [e for e in runs.read_history(run_dir) if e.purpose == "skipped"]


def test_a_cancelled_run_is_not_evaluated_and_its_eval_job_ends(env: Env) -> None:
    name = env.name("cancelled")
    proc = env.submit(*env.tiny, "train.total_training_steps=400", "checkpoint.save_freq=200", "eval.limit=2",
                      "--name", name)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    run_dir = env.runs_root / name
    train_id, eval_id = runs.last_job_id(run_dir), runs.last_job_id(run_dir, "eval")
    end = time.monotonic() + DEADLINE_S
    while not [e for e in runs.read_history(run_dir) if e.purpose == "start"]:  # resume preparation ran: training
        assert time.monotonic() < end, slurm.job_states([train_id, eval_id])
        time.sleep(0.5)
    slurm.cancel(train_id)
    assert wait_final(train_id, 60).state == "CANCELLED"
    info = wait_final(eval_id, 180)  # it starts once the training job ended, and stops at the check
    assert info.state == "COMPLETED", (info, eval_log(run_dir, eval_id)[-3000:])
    skipped = [e for e in runs.read_history(run_dir) if e.purpose == "skipped"]
    assert len(skipped) == 1 and skipped[0].job_id == eval_id, skipped
    assert "evaluation skipped: no train_done.json and no complete checkpoint" in skipped[0].note
    assert f"hpc-grpo eval {run_dir}" in skipped[0].note
    assert not (run_dir / "eval").exists() or not list((run_dir / "eval").glob("step_*.json"))
    st = env.status(run_dir)
    assert st["trained"] is None and any("evaluation skipped" in f for f in st["failures"]), st
