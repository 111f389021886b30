"""A broken weight sync is caught by the job itself, in its first steps, and `health.stop_on` stops it cleanly.

verl's real trainer and vLLM rollout on CPU (recipe tiny-verl: LoRA, as tests/local/test_learning.py trains it),
with the trainer -> vLLM weight sync broken on purpose by the test hook HPC_GRPO_TEST_BREAK_WEIGHT_SYNC=1
(engines/sync_break): vLLM keeps sampling the base model while the trainer trains the adapter. The job must flag it
by step 3 (runstate/health's weight_sync: verl's sampler-vs-trainer numbers), say so in its log, and, with
`health.stop_on=[weight_sync]`, stop with a checkpoint and the reason in the run's history: status shows
"stopped by health: weight_sync at step N (...)", the run is not trained, and `hpc-grpo resume` would carry on
from the checkpoint. The healthy learning runs raise no finding (test_learning.assert_healthy).

Kept short for CI: 4 steps asked for, the job stops itself at the flagged step; the first step alone is ~35 s.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.local.test_learning import REPO, _verl_venv, sync_numbers, train

STEPS = 4


def test_a_broken_weight_sync_stops_the_job_by_step_3(tmp_path: Path, verl_slot: None,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    from hpc_grpo.engines import sync_break
    from hpc_grpo.job.health_watch import PREFIX
    from hpc_grpo.runstate import checkpoints as ck
    from hpc_grpo.runstate import runs, trained
    from hpc_grpo.config.resolve import load_frozen

    venv = _verl_venv("vllm")
    monkeypatch.setenv(sync_break.ENV, "1")
    t0 = time.monotonic()
    run, said = train(tmp_path, "tiny-verl", f"cluster.setup.venv={venv}", "rollout.name=vllm",
                      "health.stop_on=[weight_sync]", steps=STEPS, ok=False)
    took = time.monotonic() - t0
    assert "TEST HOOK ON" in said, said[-2000:]  # plan says it loudly at submit

    # the reason, in the history: the flagged step, the numbers, the checkpoint
    (stop,) = [e for e in runs.read_history(run) if e.purpose == "failed"]
    assert stop.data["cause"] == "health" and stop.data["kind"] == "weight_sync", stop
    step = stop.data["step"]
    numbers = sync_numbers(run)
    print(f"broken weight sync: flagged at step {step}; {took:.0f} s from submit to the stopped job")
    assert step <= 3, (stop, numbers)
    assert stop.note.startswith(f"stopped by health: weight_sync at step {step} ("), stop.note
    assert stop.note.count("> limit") + stop.note.count("< limit") >= 2, stop.note  # two numbers past their limits
    assert f"checkpoint step {step} saved" in stop.note, stop.note

    # the job's log: the finding, then the stop; and the hook's own warning from vLLM's processes
    log = "\n".join(p.read_text(errors="replace") for p in sorted((run / "submitit").glob("*_0_log.out")))
    lines = [line for line in log.splitlines() if PREFIX in line]
    assert len(lines) == 1 and f"{PREFIX} weight_sync: step {step}: " in lines[0], lines
    assert "saving and stopping the job" in lines[0] and "driver stopped: stopped by health" in log
    assert "TEST HOOK ON" in log

    # a clean stop: the flagged step's checkpoint is complete, the run is not trained
    spec = load_frozen(run / "spec.yaml")
    newest = ck.newest_complete(ck.list_checkpoints(run, "verl"))
    assert newest is not None and newest.step >= step, newest
    verdict = trained.decide(spec)
    assert not verdict.trained and verdict.reason.startswith("stopped by health"), verdict

    # what the user sees
    env = {**os.environ, "PYTHONPATH": str(REPO), "HOME": str(tmp_path / "home")}
    env.pop(sync_break.ENV)
    shown = subprocess.run([sys.executable, "-m", "hpc_grpo.cli.app", "status", str(run), "--json"], env=env,
                           capture_output=True, text=True, timeout=120, check=False)
    assert shown.returncode == 0, shown.stderr
    st = json.loads(shown.stdout)
    assert any(f"stopped by health: weight_sync at step {step} (" in f for f in st["failures"]), st["failures"]
    assert any("the rollout is not the policy being trained" in h for h in st["health"]), st["health"]
    assert any(sync_break.ENV in w for w in st["warnings"]), st["warnings"]

    # resume carries on from the checkpoint (shown, not run: the dry run plans and renders it)
    again = subprocess.run([sys.executable, "-m", "hpc_grpo.cli.app", "resume", str(run), "--dry-run"], env=env,
                           cwd=tmp_path, capture_output=True, text=True, timeout=300, check=False)
    assert again.returncode == 0, (again.stdout[-3000:], again.stderr[-3000:])
    assert f"global_step_{newest.step}" in again.stdout + again.stderr, again.stdout[-3000:]
