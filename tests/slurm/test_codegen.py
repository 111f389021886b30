"""Code generation end to end on the real local Slurm cluster, submitted by an unprivileged user (nobody trains as
root on a cluster): `hpc-grpo data codegen` from the shipped problems file, then `submit recipe=tiny-codegen` (trl
on CPU, the execution reward in the job) and its chained eval job, which evaluates HumanEval by default (a code
reward's tasks, config.spec.default_eval_tasks) with no GSM8K file anywhere. Checked: the training job COMPLETED with a
reward logged for every step and its checkpoints; the eval job COMPLETED with HumanEval pass@1 for the base model
and the trained policy in RUN/eval/step_4.json; Slurm ran both jobs as the user; nothing in the test's folder
belongs to anyone else.

Everything runs as hpcgrpo-user (tests/slurm/test_unprivileged.py's `as_user`: setpriv, a minimal environment)
with HOME set to a fresh folder in that user's home, so the recipe's own paths (~/hpc-grpo-data/codegen-tiny,
~/.cache/hpc-grpo/tiny-qwen2) land there unchanged: the recipe runs as a user would run it, no data or model
override (the runs root is moved into that folder: slurm-dev's /tmp/hpc-grpo-runs belongs to root).

The sandbox's isolation as that user: each job prints at its start what the code sandbox gets on its node (`code
sandbox on NODE: MODE ... (probed; grpo.code.isolation=auto)`, hpc_grpo/cluster/isolation.py). As a normal user
that must be `userns` (unprivileged user namespaces), in both jobs: not limits-only (the recipe does not consent to
it, so the job would have refused), and not namespaces+uid (root's). Any HumanEval sample that reached the sandbox
must report the same mode; the random model writes no code, so few do: the job line is the evidence.
"""

from __future__ import annotations

import json
import re
import shutil
import time
from pathlib import Path

import pytest

from hpc_grpo.config.resolve import load_frozen
from hpc_grpo.runstate import runs
from hpc_grpo.runstate import layout
from tests.slurm.jobs import wait_final
from tests.slurm.test_unprivileged import USER, As, _owners, _sacct_user, as_user

pytestmark = [pytest.mark.slurm, pytest.mark.usefixtures("slurm_cluster")]

DEADLINE_S = 900.0  # per job: about 1-2 min on 2 idle cores; a shared, loaded machine has taken 10x that
STEPS = 4  # of the recipe's 8, a checkpoint every 2: the same code path in half the time
EVAL_LIMIT = 4  # the recipe's eval.limit: HumanEval/0-3
# hpc_grpo/cluster/isolation.py's job line: "code sandbox on NODE: MODE (...)" (or "code sandbox: limits-only ...")
_ISOLATION_LINE = re.compile(r"code sandbox(?: on \S+)?: (namespaces\+uid|userns|limits-only)\b")


@pytest.fixture(scope="module")
def user() -> As:
    return as_user({})


def _log(run_dir: Path, job_id: str) -> str:
    return "\n".join(p.read_text(errors="replace") for p in sorted((run_dir / "submitit").glob(f"{job_id}_0_log.*")))


def _isolation_modes(text: str) -> list[str]:
    return _ISOLATION_LINE.findall(text)


def test_tiny_codegen_trains_and_evaluates_humaneval_as_an_unprivileged_user(user: As) -> None:
    t0 = time.monotonic()
    work = user.fresh_dir("codegen")
    me = As(user.uid, user.gid, work, {**user.env, "HOME": str(work)})  # the recipe's ~ is this folder

    prep = me.cli("data", "codegen", "--source", "tiny", "--out", str(work / "hpc-grpo-data" / "codegen-tiny"),
                  cwd=work)
    assert prep.returncode == 0, prep.stdout + prep.stderr
    assert "12 train, 4 test rows" in prep.stdout

    name = work.name  # codegen-TAG: the run is named as its folder
    runs_root = work / "runs"
    run_dir = runs_root / name
    proc = me.cli("submit", "recipe=tiny-codegen", "cluster=slurm-dev", f"cluster.runs_root={runs_root}",
                  f"train.total_training_steps={STEPS}", "checkpoint.save_freq=2", "--name", name, "--no-wait",
                  cwd=work)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    said = " ".join(proc.stdout.split())
    assert f"Evaluation: humaneval (first {EVAL_LIMIT} problems) on hf, cpu, 0 GPU(s)" in said, proc.stdout
    assert load_frozen(run_dir / layout.SPEC_FILE).recipe.eval.tasks == ["humaneval"]  # what the eval job reads
    history = runs.read_history(run_dir)
    assert [e.purpose for e in history] == ["train", "eval"], history
    train_id, eval_id = history[0].job_id, history[1].job_id
    assert f"Eval job: {eval_id} (afterany {train_id})" in said, proc.stdout

    train = wait_final(train_id, DEADLINE_S)
    train_log = _log(run_dir, train_id)
    assert train.state == "COMPLETED", (train, train_log[-3000:])
    t_train = time.monotonic() - t0
    ev = wait_final(eval_id, DEADLINE_S)
    eval_log = _log(run_dir, eval_id)
    assert ev.state == "COMPLETED", (ev, eval_log[-3000:])
    t_eval = time.monotonic() - t0

    # Slurm ran both jobs as the user.
    for job_id in (train_id, eval_id):
        assert _sacct_user(job_id) == USER, job_id
        log = run_dir / "submitit" / f"{job_id}_0_log.out"
        assert log.is_file() and log.stat().st_uid == user.uid, log

    # Training: a reward for every step, from the execution reward; checkpoints.
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1)), rows
    assert all(isinstance(r.get("reward"), float) for r in rows), rows
    # every completion of the random model is scored by the execution reward: penalties, never a pass
    assert all(-0.5 <= r["reward"] <= 0.0 for r in rows), rows
    ckpts = sorted(p.name for p in (run_dir / "checkpoints").glob("checkpoint-*"))
    assert ckpts == ["checkpoint-2", "checkpoint-4"], ckpts
    done = json.loads((run_dir / "train_done.json").read_text())
    assert done["final_step"] == STEPS and done["last_checkpoint"].endswith("checkpoint-4")

    # Evaluation: HumanEval pass@1 of the policy (step 4) and of the base model, and nothing else.
    result = json.loads((run_dir / "eval" / f"step_{STEPS}.json").read_text())
    assert result["step"] == STEPS and set(result["scores"]) == {"humaneval"}, result.get("scores")
    assert set(result["base"]["scores"]) == {"humaneval"}, result["base"]
    scored = {"policy": result["scores"]["humaneval"], "base": result["base"]["scores"]["humaneval"]}
    for who, s in scored.items():
        assert s["n"] == EVAL_LIMIT and 0.0 <= s["pass@1"] <= 1.0, (who, s)
        assert sum(s["outcomes"].values()) == EVAL_LIMIT, (who, s)  # every sample went through the sandbox
    assert result["metrics"]["humaneval/pass@1"] == scored["policy"]["pass@1"]
    assert result["settings"]["tasks"] == ["humaneval"] and result["settings"]["test_file"] == ""

    # The sandbox's isolation as this user: the jobs' start-up line (few samples of a random model reach the sandbox).
    for what, text in (("training", train_log), ("eval", eval_log)):
        modes = _isolation_modes(text)
        assert modes, f"the {what} job's log has no 'code sandbox on NODE: MODE' line:\n{text[-2000:]}"
        assert set(modes) == {"userns"}, f"the {what} job's sandbox as {USER}: {modes} (expected userns)"
    ran = {who: s["isolation"] for who, s in scored.items() if s["isolation"] is not None}
    assert set(ran.values()) <= {"userns"}, ran
    # Nothing in the test's folder (data, model, runs, caches the jobs wrote) belongs to anyone else.
    owners = _owners(work)
    assert set(owners) == {user.uid}, {uid: paths[:10] for uid, paths in owners.items() if uid != user.uid}

    print(f"\ntiny-codegen as {USER} (uid {user.uid}) on slurm-dev: train job {train_id} done at {t_train:.1f}s, "
          f"eval job {eval_id} done at {t_eval:.1f}s; HumanEval pass@1 base {scored['base']['pass@1']:.3f}, "
          f"policy {scored['policy']['pass@1']:.3f}; rewards {[round(r['reward'], 3) for r in rows]}; "
          f"code sandbox (job lines): training {_isolation_modes(train_log)}, eval {_isolation_modes(eval_log)}")
    shutil.rmtree(work)
