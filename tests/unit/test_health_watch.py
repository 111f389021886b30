"""The job watches its own first steps (job/health_watch): each finding once in the job's log and as a W&B alert,
and a finding `health.stop_on` names stops the job with its reason in the run's history, the run not trained. The
verl side follows verl's file-logger rows as the driver writes them; the driver watch stops the driver. Real files,
real child processes, W&B's real client (offline: its run file stands in for the W&B server)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import require_verl_python

from hpc_grpo.commands import status
from hpc_grpo.config.resolve import resolve_spec
from hpc_grpo.engines import sync_break
from hpc_grpo.job import health_watch
from hpc_grpo.job.driver_watch import run_watched
from hpc_grpo.launch.render import render_all, write_files
from hpc_grpo.runstate import layout, runs, trained
from hpc_grpo.runstate.health import ROLLOUT_DIFF_MAX
from tests import ckpt_trees as trees

HEALTHY = {"critic/score/mean": 0.3, "actor/pg_loss": 0.01, "actor/grad_norm": 0.5, "actor/entropy": 0.8,
           "training/rollout_probs_diff_mean": 0.0005}


def verl_run(tmp: Path, *overrides: str):
    spec = resolve_spec("tiny-verl", "local", [f"cluster.runs_root={tmp}", "train.total_training_steps=8",
                                               *overrides], run_name="v")
    write_files(spec.path, render_all(spec))
    return spec


def write_verl_rows(spec, diffs: list[float]) -> None:
    """verl's file logger, as the driver writes it (one {"step", "data"} line per step)."""
    with layout.verl_log(spec.path).open("w") as fh:
        for i, d in enumerate(diffs):
            fh.write(json.dumps({"step": i + 1, "data": {**HEALTHY, "training/rollout_probs_diff_mean": d}}) + "\n")


def test_each_finding_is_logged_and_alerted_once_and_only_stop_on_stops(tmp_path: Path) -> None:
    spec = verl_run(tmp_path, "health.stop_on=[nan]")
    said, alerts = [], []
    watcher = health_watch.Watcher(spec, say=said.append, alert=lambda h, stops: alerts.append((h.kind, stops)))
    rows = [{"step": 1, "rollout_probs_diff": 0.0004}, {"step": 2, "rollout_probs_diff": 0.5}]
    assert watcher.check(rows) is None  # weight_sync is not in stop_on: logged, training goes on
    assert watcher.check(rows) is None and len(said) == 1  # once per kind, however often it is looked at
    assert said[0].startswith(f"{health_watch.PREFIX} weight_sync: step 2: the rollout is not the policy")
    assert "health.stop_on: [weight_sync] would stop it" in said[0]
    stop = watcher.check([*rows, {"step": 3, "rollout_probs_diff": 0.5, "loss": None}])
    assert stop is not None and stop.kind == "nan" and stop.step == 3
    assert "saving and stopping" in said[-1]
    assert alerts == [("weight_sync", False), ("nan", True)]


def test_an_alert_that_fails_is_said_and_the_watch_goes_on(tmp_path: Path) -> None:
    spec = verl_run(tmp_path, "health.stop_on=[weight_sync]")
    said: list[str] = []

    def broken(h, stops):
        raise ConnectionError("no route to W&B")

    watcher = health_watch.Watcher(spec, say=said.append, alert=broken)
    assert watcher.check([{"step": 1, "rollout_probs_diff": 0.5}]) is not None
    assert "was not sent: ConnectionError: no route to W&B" in said[-1]


def test_a_stop_is_in_the_history_status_shows_it_and_the_run_is_not_trained(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.delenv(sync_break.ENV, raising=False)
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    spec = verl_run(tmp_path, "health.stop_on=[weight_sync]", "train.total_training_steps=3")
    runs.append_history(spec.path, "4242", "train", "local")
    runs.append_history(spec.path, "4242", "start", "local", data={"test_hook": sync_break.ENV})
    trees.verl_fsdp(spec.path, 3, world=1, lora=True)  # the final step's checkpoint: trained, were it not stopped
    write_verl_rows(spec, [0.0004, 0.0005, 0.04])
    health = health_watch.VerlHealth(spec, log=lambda m: None, poll_s=0.05)
    health.rows.before = None  # as if verl had written the file after the job started
    health.start()
    deadline = time.monotonic() + 20
    while health.stop_reason is None and time.monotonic() < deadline:
        time.sleep(0.05)
    health.close()
    assert health.stop_reason is not None
    assert health.stop_reason.startswith("stopped by health: weight_sync at step 3 (rollout_probs_diff_mean 0.04 "
                                         f"> limit {ROLLOUT_DIFF_MAX})")
    (event,) = [e for e in runs.read_history(spec.path) if e.purpose == "failed"]
    assert event.data == {"cause": "health", "kind": "weight_sync", "step": 3}
    assert "checkpoint step 3 saved" in event.note and "hpc-grpo resume" in event.note
    verdict = trained.decide(spec)
    assert not verdict.trained and verdict.reason.startswith("stopped by health: weight_sync at step 3")
    st = status.run_status(spec.path)
    assert any("stopped by health: weight_sync at step 3" in f for f in st.failures), st.failures
    assert any("rollout is not the policy" in h for h in st.health), st.health
    assert any("4242" in w and sync_break.ENV in w for w in st.warnings), st.warnings
    # a resume starts a job: the stop no longer decides, the checkpoints do
    runs.append_history(spec.path, "4243", "start", "local")
    assert trained.decide(spec).trained


def test_rows_of_a_former_start_are_not_read(tmp_path: Path) -> None:
    """verl rewrites its file logger from scratch at each start: until this driver has written it, the rows there
    are a former start's (a resumed run must not stop on the finding that stopped it before)."""
    spec = verl_run(tmp_path)
    write_verl_rows(spec, [0.5, 0.5])
    fresh = health_watch.FreshRows(layout.verl_log(spec.path))
    assert fresh.rows() == []
    write_verl_rows(spec, [0.0004])  # the new start's first step
    assert [r["step"] for r in fresh.rows()] == [1]
    missing = health_watch.FreshRows(tmp_path / "none.jsonl")
    assert missing.rows() == []


def test_the_driver_is_stopped_when_health_asks() -> None:
    said: list[str] = []
    asked = {"after": time.monotonic() + 1.0}
    code = "import time; print('step:1', flush=True); time.sleep(600)"
    t0 = time.monotonic()
    status_ = run_watched([sys.executable, "-c", code], env=dict(os.environ), log=said.append,
                          stop_when=lambda: "stopped by health: nan at step 1" if time.monotonic() > asked["after"]
                          else None)
    assert status_ == health_watch.HEALTH_STOPPED and time.monotonic() - t0 < 30
    assert said == ["driver stopped: stopped by health: nan at step 1"]


def test_wandb_alert_reaches_the_runs_record(tmp_path: Path, monkeypatch) -> None:
    """W&B's own client, offline: the run file it writes stands in for the W&B server (a test double for the
    server only). The job process has no W&B run of its own (verl's TaskRunner holds it), so it attaches to the
    run's id; the alert is recorded in that run, and `wandb sync` would send it."""
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    spec = verl_run(tmp_path, "logging.logger=[console,wandb]")
    alert = health_watch.alerter(spec)
    assert alert is not None and health_watch.alerter(verl_run(tmp_path / "off")) is None  # W&B off: no alert
    watcher = health_watch.Watcher(spec, say=lambda m: None, alert=alert)
    watcher.check([{"step": 2, "rollout_probs_diff": 0.3}])
    alert.close()
    (record,) = list((spec.path / "wandb").glob(f"offline-run-*-{runs.wandb_run_id(spec.path)}/run-*.wandb"))
    deadline = time.monotonic() + 20  # W&B's service may still be writing the file when finish() returns
    while b"hpc-grpo health" not in (data := record.read_bytes()) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert b"hpc-grpo health: weight_sync at step 2" in data and b"the rollout is not the policy" in data


def test_the_sync_break_is_off_unless_exactly_one() -> None:
    assert not sync_break.enabled({}) and not sync_break.enabled({sync_break.ENV: "true"})
    assert sync_break.enabled({sync_break.ENV: "1"})
    assert "TEST" in sync_break.ENV and sync_break.ENV in sync_break.warning()


PROBE = """
import os
import subprocess
from hpc_grpo.engines import sync_break, vllm_cpu
from verl.workers.rollout.vllm_rollout.utils import vLLMColocateWorkerExtension as ext
os.environ.pop(sync_break.ENV, None)
vllm_cpu.register()
before = getattr(ext._update_weights, "_hpc_grpo_broken", False)
os.environ[sync_break.ENV] = "1"
vllm_cpu.register()  # what vLLM calls in each of its processes
after = getattr(ext._update_weights, "_hpc_grpo_broken", False)
touched = ext._update_weights(object(), [("model.w", None)], peft_config=None, base_sync_done=True)
print("RESULT", before, after, touched)
"""


def test_the_hook_lands_on_verls_vllm_update_only_with_the_variable() -> None:
    """In verl's own environment: hpc-grpo's vLLM plugin leaves verl's worker-side weight update alone, and with
    HPC_GRPO_TEST_BREAK_WEIGHT_SYNC=1 replaces it with a no-op (an object without a model: any real update would
    fail on it)."""
    python = require_verl_python(Path(__file__).resolve().parents[2] / ".venv-verl")
    env = {k: v for k, v in os.environ.items() if k != sync_break.ENV}
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[2])
    proc = subprocess.run([str(python), "-c", PROBE], env=env, capture_output=True, text=True, timeout=300,
                          check=False)
    assert "RESULT False True None" in proc.stdout, (proc.stdout[-2000:], proc.stderr[-3000:])
    assert proc.stdout.count("TEST HOOK ON") == 1, proc.stdout[-2000:]
