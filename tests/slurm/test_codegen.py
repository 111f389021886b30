"""Code generation end to end on the real local Slurm cluster: `hpc-grpo data codegen` from the shipped problems
file, then `submit recipe=tiny-codegen` (trl on CPU, the execution reward in the job): COMPLETED, a reward logged
for every step, checkpoints written, and HumanEval pass@1 for the base model and the trained policy.

HOME is the test's temp dir, so the recipe's own paths (~/hpc-grpo-data/codegen-tiny, ~/.cache/hpc-grpo/tiny-qwen2)
land there unchanged: the test runs the recipe exactly as a user would, no data or model override.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest

from tests.slurm.test_submit import Env, last_job, make_env, wait_final

pytestmark = [pytest.mark.slurm, pytest.mark.usefixtures("slurm_cluster")]

DEADLINE_S = 900.0  # about 1-2 min on 2 idle cores; a shared, loaded machine has taken 10x that


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Env:
    return make_env(tmp_path_factory.mktemp("codegen"))


def test_tiny_codegen_trains_on_slurm(env: Env) -> None:
    prep = env.cli("data", "codegen", "--source", "tiny", "--out", str(Path(env.env["HOME"]) / "hpc-grpo-data/codegen-tiny"))
    assert prep.returncode == 0, prep.stdout + prep.stderr
    assert "12 train, 4 test rows" in prep.stdout
    name = env.name("tiny-codegen")
    # 4 of the recipe's 8 steps, a checkpoint every 2: the same code path in half the time
    proc = env.submit("recipe=tiny-codegen", "train.total_training_steps=4", "checkpoint.save_freq=2", "--name", name)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    run_dir = env.runs_root / name
    job_id = last_job(run_dir)
    t0 = time.monotonic()
    info = wait_final(job_id, DEADLINE_S)
    log = run_dir / "submitit" / f"{job_id}_0_log.out"
    text = log.read_text() if log.exists() else "no log"
    print(f"tiny-codegen on slurm-dev: job {job_id} {info.state} after {time.monotonic() - t0:.1f}s")
    assert info.state == "COMPLETED", (info, text[-3000:])
    # the job says at its start which isolation the reward's sandbox got on its node (probed there)
    assert re.search(r"code sandbox on \S+: (namespaces\+uid|userns) .*\(probed; grpo\.code\.isolation=auto\)", text), text[:3000]
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, 5))
    assert all(isinstance(r.get("reward"), float) for r in rows), rows
    # every completion of the random model is scored by the execution reward: penalties, never a pass
    assert all(-0.5 <= r["reward"] <= 0.0 for r in rows), rows
    ckpts = sorted(p.name for p in (run_dir / "checkpoints").glob("checkpoint-*"))
    assert ckpts == ["checkpoint-2", "checkpoint-4"]
    done = json.loads((run_dir / "train_done.json").read_text())
    assert done["final_step"] == 4 and done["last_checkpoint"].endswith("checkpoint-4")

    # HumanEval pass@1, base model beside the policy, through the same executor
    report_path = env.root / "humaneval.json"
    ev = env.cli("eval-code", str(run_dir), "--limit", "2", "--max-new-tokens", "16", "--json-out", str(report_path),
                 timeout=400)
    assert ev.returncode == 0, ev.stdout + ev.stderr
    report = json.loads(report_path.read_text())
    assert [m["label"] for m in report["models"]] == ["base", "policy"]
    for m in report["models"]:
        assert m["problems"] == 2 and 0.0 <= m["pass@1"] <= 1.0
        assert m["isolation"] in ("namespaces+uid", "userns", None)
