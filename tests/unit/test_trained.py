"""Whether a run counts as trained (hpc_grpo.runstate.trained) on checkpoint trees in the pinned verl's and trl's real layouts
(tests/ckpt_trees.py): train_done.json, the final checkpoint of a job that failed afterwards (W&B's teardown can),
a run that stopped short, a torn final save; the eval job's --if-trained gate; status's line; the afterany
dependency the eval job is queued with."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest

from hpc_grpo.evaluation import evaluate
from hpc_grpo.launch import render
from hpc_grpo.runstate import runs, trained
from hpc_grpo.commands import status
from hpc_grpo.job import eval_job
from hpc_grpo.launch.render import render_all, write_files
from hpc_grpo.config.resolve import resolve_spec
from hpc_grpo.runstate import layout
from tests import ckpt_trees as trees


def verl_run(tmp: Path, steps: int = 4):
    spec = resolve_spec("qwen2.5-3b-gsm8k-lora", "slurm-dev",
                        [f"cluster.runs_root={tmp}", f"train.total_training_steps={steps}"], run_name="v")
    write_files(spec.path, render_all(spec))
    return spec


def trl_run(tmp: Path):
    spec = resolve_spec("tiny-gsm8k", "local", [f"cluster.runs_root={tmp}"], run_name="t")
    write_files(spec.path, render_all(spec))
    return spec


def test_verl_final_checkpoint_counts_as_trained_without_train_done(tmp_path: Path) -> None:
    spec = verl_run(tmp_path)
    trees.verl_fsdp(spec.path, 2, world=1, lora=True)
    assert not trained.decide(spec).trained
    assert "step 2 of 4 (train.total_training_steps)" in trained.decide(spec).reason
    trees.verl_fsdp(spec.path, 4, world=1, lora=True)
    verdict = trained.decide(spec)
    assert verdict.trained and verdict.by_checkpoint and verdict.step == 4, verdict
    assert verdict.reason == "final checkpoint step 4 written (of 4 steps, train.total_training_steps)"


def test_a_torn_final_save_is_not_trained(tmp_path: Path) -> None:
    spec = verl_run(tmp_path)
    trees.verl_fsdp(spec.path, 2, world=2)
    trees.verl_fsdp(spec.path, 4, world=2)
    trees.truncate_half(spec.path / "checkpoints/global_step_4/actor/model_world_size_2_rank_1.pt")
    verdict = trained.decide(spec)
    assert not verdict.trained and "newest complete checkpoint is step 2 of 4" in verdict.reason, verdict


def test_a_live_training_job_means_not_yet_even_at_the_final_step(tmp_path: Path) -> None:
    spec = verl_run(tmp_path)
    trees.verl_fsdp(spec.path, 4, world=1)
    assert trained.decide(spec).trained
    verdict = trained.decide(spec, {"812": "PENDING"})  # e.g. requeued after its last save
    assert not verdict.trained and "812 (PENDING)" in verdict.reason


def test_trl_total_from_trainer_state_and_train_done_wins(tmp_path: Path) -> None:
    spec = trl_run(tmp_path)  # the recipe says 24 steps; trl recorded max_steps 100 in its checkpoints
    trees.trl_checkpoint(spec.path, 24)
    verdict = trained.decide(spec)
    assert not verdict.trained and "step 24 of 100 (trainer_state.json max_steps)" in verdict.reason, verdict
    trees.trl_checkpoint(spec.path, 100)
    assert trained.decide(spec).reason == "final checkpoint step 100 written (of 100 steps, trainer_state.json max_steps)"
    (spec.path / "train_done.json").write_text(json.dumps({"final_step": 100}))
    verdict = trained.decide(spec)
    assert verdict.trained and not verdict.by_checkpoint and verdict.reason == "train_done.json: step 100"


def test_no_checkpoint_is_not_trained(tmp_path: Path) -> None:
    spec = trl_run(tmp_path)
    verdict = trained.decide(spec)
    assert not verdict.trained and "no complete checkpoint" in verdict.reason


def test_eval_job_skips_an_untrained_run_at_once_and_says_why(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spec = verl_run(tmp_path)
    trees.verl_fsdp(spec.path, 2, world=1)
    monkeypatch.setenv("SLURM_JOB_ID", "902")
    runs.append_history(spec.path, "901", "train", "local")  # the job the eval followed: excluded from "live"
    rc = eval_job.main(evaluate.job_argv(spec.path, after="901"))
    assert rc == 0
    last = runs.read_history(spec.path)[-1]
    assert (last.purpose, last.job_id, last.executor) == ("skipped", "902", "slurm")
    assert "evaluation skipped" in last.note and "step 2 of 4" in last.note and "training job 901 has ended" in last.note
    assert not (spec.path / layout.EVAL_DIR).exists()  # nothing was exported or scored
    st = status.run_status(spec.path)
    assert any("evaluation skipped" in f for f in st.failures) and st.trained is None


def test_eval_job_argv_and_dependency_are_afterany_with_the_gate() -> None:
    assert evaluate.dependency("77") == "afterany:77"
    assert evaluate.job_argv(Path("/r"), after="77") == ["--run", "/r", "--if-trained", "--after", "77"]
    assert "--if-trained" not in evaluate.job_argv(Path("/r"))  # by hand: what was asked, no gate


def test_rendered_eval_script_carries_afterany(tmp_path: Path) -> None:
    spec = verl_run(tmp_path)
    text = render.render_sbatch(evaluate.eval_spec(spec), "python -m submitit.core._submit /x",
                                extra=[("dependency", evaluate.dependency("4242"))])
    assert "#SBATCH --dependency=afterany:4242" in text and "afterok" not in text


def test_status_says_trained_when_the_job_failed_after_its_final_save(tmp_path: Path) -> None:
    spec = trl_run(tmp_path)
    trees.trl_checkpoint(spec.path, 100)  # final step (max_steps 100); no train_done.json: the job died after
    job = "1999999"  # a pid no process has here (checked just below): the local job has ended
    assert not runs._pid_alive(job)
    runs.append_history(spec.path, job, "train", "local")
    runs.append_history(spec.path, job, "failed", "local", note="wandb: BrokenPipeError in teardown (exit 1)")
    folder = layout.submitit_dir(spec.path)
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / f"{job}_0_result.pkl", "wb") as fh:
        pickle.dump(("error", "Traceback: wandb teardown"), fh)
    st = status.run_status(spec.path)
    assert st.jobs[0].state == "FAILED"
    assert st.trained == ("trained (final checkpoint step 100 written; the job then failed: "
                          "wandb: BrokenPipeError in teardown (exit 1))")
    assert st.as_dict()["trained"] == st.trained


def test_status_line_without_a_failure_note_names_the_slurm_end() -> None:
    verdict = trained.Trained(True, "final checkpoint step 8 written (of 8 steps, x)", 8, by_checkpoint=True)
    rows = [status.JobRow("11", "train", "t", "FAILED", 5, "1:0", "node1"),
            status.JobRow("12", "eval", "t", "COMPLETED", 5, "0:0", "node2")]
    assert status.trained_line(verdict, rows, []) == \
        "trained (final checkpoint step 8 written; the job then failed: job 11 ended FAILED, exit 1:0)"
    rows[0] = status.JobRow("11", "train", "t", "COMPLETED", 5, "0:0", "node1")
    assert status.trained_line(verdict, rows, []) == "trained (final checkpoint step 8 written)"
    assert status.trained_line(trained.Trained(False, "no"), rows, []) is None


def test_a_local_job_whose_controller_is_a_zombie_is_not_live(tmp_path: Path) -> None:
    """The controller of a local job outlives `submit`; when it ends, PID 1 reaps it when it gets to it. Until then
    it is a zombie: `resume` must not be refused as if the job still ran."""
    import os
    import subprocess
    import time

    child = subprocess.Popen(["true"])
    deadline = time.monotonic() + 10
    while Path(f"/proc/{child.pid}/stat").read_text().rsplit(")", 1)[-1].split()[0] != "Z":
        assert time.monotonic() < deadline, "the child never became a zombie"
        time.sleep(0.05)
    try:
        os.kill(child.pid, 0)  # the signal check alone would call it alive
        assert not runs._pid_alive(str(child.pid))
        runs.append_history(tmp_path, str(child.pid), "train", "local")
        assert runs.live_jobs(tmp_path) == {}
    finally:
        child.wait()
    alive = subprocess.Popen(["sleep", "30"])
    try:
        assert runs._pid_alive(str(alive.pid))
    finally:
        alive.kill()
        alive.wait()
