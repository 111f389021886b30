"""`hpc-grpo eval --model PATH` on the tiny model: real lm-eval (gsm8k, offline, local files), run as a user
would, and its per-problem verdicts equal lm-eval's own filters applied to the same generations."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ONE_THREAD

from tests.unit.test_eval_scoring import lm_eval_score

from hpc_grpo.rewards.gsm8k import gsm8k_reward


def test_eval_model_on_the_tiny_model(isolated: Path, gsm8k_dir: Path) -> None:
    """GSM8K through lm-eval with per-problem verdicts equal to lm-eval's own filters, and `--tasks gsm8k,humaneval`
    scoring both into one JSON (HumanEval through the sandboxed executor of the training reward): one eval process
    for both (each costs CI an lm-eval start-up and the model's generations)."""
    from hpc_grpo.data.tiny_model import ensure_tiny_model

    model = ensure_tiny_model(isolated / "tiny-qwen2")
    env = {**os.environ, "HF_HOME": str(isolated / "hf"), "HF_HUB_OFFLINE": "1", "HPC_GRPO_DATA": str(isolated / "none"),
           **ONE_THREAD}
    proc = subprocess.run([sys.executable, "-m", "hpc_grpo.cli.app", "eval", "--model", str(model), "--limit", "3",
                           "--tasks", "gsm8k,humaneval", "--num-fewshot", "0", "--max-gen-toks", "24",
                           "--test-file", f"{gsm8k_dir}/test.jsonl", "--train-file", f"{gsm8k_dir}/train.jsonl",
                           "--out", str(isolated / "out")],
                          capture_output=True, text=True, env=env, cwd=isolated, timeout=400, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "Evaluation" in proc.stdout and "problems/s" in proc.stdout  # the table (rich wraps its headers)
    result = json.loads((isolated / "out" / "eval.json").read_text())
    assert set(result["scores"]) == {"gsm8k", "humaneval"}
    gsm = result["scores"]["gsm8k"]
    assert gsm["n"] == 3 and [s["doc_id"] for s in gsm["samples"]] == [0, 1, 2]
    assert result["model"] == str(model) and result["step"] is None and result["published"] is None
    for s in gsm["samples"]:
        assert s["strict_correct"] == lm_eval_score(s["completion"], s["target"], "strict-match")[1]
        assert s["flexible_correct"] == lm_eval_score(s["completion"], s["target"], "flexible-extract")[1]
        assert s["verl_strict"] == gsm8k_reward(s["completion"], s["target"])
    assert gsm["strict_match"] == pytest.approx(sum(s["strict_correct"] for s in gsm["samples"]) / 3)
    assert result["settings"]["limit"] == 3 and result["wall_time_s"] > 0

    he = result["scores"]["humaneval"]
    assert he["n"] == 3 and 0.0 <= he["pass@1"] <= 1.0 and sum(he["outcomes"].values()) == 3  # one per problem
    assert result["metrics"]["humaneval/pass@1"] == he["pass@1"]
    assert result["metrics"]["gsm8k/strict_match"] == gsm["strict_match"]
    assert "pass@1" in proc.stdout and "humaneval" in proc.stdout


def test_eval_model_bad_input_exits_2(isolated: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "hpc_grpo.cli.app", "eval", "--model", str(isolated / "nope"),
                           "--test-file", str(isolated / "t.jsonl"), "--train-file", str(isolated / "t.jsonl")],
                          capture_output=True, text=True, cwd=isolated, timeout=60, check=False)
    assert proc.returncode == 2 and "does not exist" in proc.stderr + proc.stdout
    proc = subprocess.run([sys.executable, "-m", "hpc_grpo.cli.app", "eval", "--model", str(isolated), "--tasks", "mmlu"],
                          capture_output=True, text=True, cwd=isolated, timeout=60, check=False)
    assert proc.returncode == 2 and "unknown task" in proc.stderr + proc.stdout


def test_eval_humaneval_alone_without_gsm8k_files(isolated: Path) -> None:
    """humaneval alone needs no GSM8K files (HPC_GRPO_DATA points at an empty folder) and no lm-eval."""
    from hpc_grpo.data.tiny_model import ensure_tiny_model

    model = ensure_tiny_model(isolated / "tiny-qwen2")
    env = {**os.environ, "HF_HOME": str(isolated / "hf"), "HF_HUB_OFFLINE": "1", "HPC_GRPO_DATA": str(isolated / "none"),
           **ONE_THREAD}
    alone = subprocess.run([sys.executable, "-m", "hpc_grpo.cli.app", "eval", "--model", str(model), "--limit", "2",
                            "--max-gen-toks", "16", "--tasks", "humaneval", "--out", str(isolated / "alone")],
                           capture_output=True, text=True, env=env, cwd=isolated, timeout=400, check=False)
    assert alone.returncode == 0, alone.stdout[-3000:] + alone.stderr[-3000:]
    only = json.loads((isolated / "alone" / "eval.json").read_text())
    assert set(only["scores"]) == {"humaneval"} and "lm_eval_cli" not in only
    assert only["settings"]["test_file"] == "" and only["scores"]["humaneval"]["n"] == 2


def test_eval_model_without_tasks_scores_gsm8k(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No --tasks: the eval job scores GSM8K (the lm-eval run itself is the test above's; here only what it is
    asked to run, so the default costs no second lm-eval start-up)."""
    from hpc_grpo.job import eval_job

    asked = []

    def score_model(model: str, settings: object, task_dir: Path) -> dict:
        asked.append(settings)
        return {"scores": {}}

    monkeypatch.setattr(eval_job, "score_model", score_model)
    data = tmp_path / "gsm8k.jsonl"
    data.write_text("")
    assert eval_job.main(["--model", str(tmp_path), "--out", str(tmp_path / "out"), "--train-file", str(data),
                          "--test-file", str(data)]) == 0
    assert [s.tasks for s in asked] == [("gsm8k",)]  # type: ignore[attr-defined]
    assert json.loads((tmp_path / "out" / "eval.json").read_text())["step"] is None
