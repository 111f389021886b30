"""The scores go into the run's own W&B run (offline here): the id training used, keys eval/gsm8k/*."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from hpc_grpo.runstate import runs
from hpc_grpo.config.resolve import resolve_spec

pytest.importorskip("wandb")


def test_eval_logs_into_the_runs_wandb_run(isolated: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from hpc_grpo.job.eval_job import log_wandb

    monkeypatch.setenv("WANDB_MODE", "offline")
    for var in ("WANDB_CACHE_DIR", "WANDB_CONFIG_DIR", "WANDB_DATA_DIR"):
        monkeypatch.setenv(var, str(isolated / var.lower()))
    spec = resolve_spec("tiny-gsm8k", "local", [f"cluster.runs_root={isolated / 'runs'}",
                                                "logging.logger=[console,wandb]"], run_name="wb")
    spec.path.mkdir(parents=True)
    result = {"step": 4, "problems_per_s": 2.5,
              "metrics": {"gsm8k/strict_match": 0.25, "gsm8k/flexible_extract": 0.5, "gsm8k/verl_strict_reward": 0.2}}
    log_wandb(spec, result)
    run_id = runs.wandb_run_id(spec.path)
    files = list((spec.path / "wandb").glob(f"offline-run-*-{run_id}/run-{run_id}.wandb"))
    assert len(files) == 1, list((spec.path / "wandb").rglob("*"))
    keys = [k.encode() for k in ("eval/gsm8k/strict_match", "eval/gsm8k/flexible_extract",
                                 "eval/gsm8k/verl_strict_reward", "eval/step")]
    end = time.monotonic() + 60  # wandb's service process writes the file after finish() returns
    while not all(k in files[0].read_bytes() for k in keys):
        assert time.monotonic() < end, [k for k in keys if k not in files[0].read_bytes()]
        time.sleep(0.2)


def test_no_wandb_logger_no_wandb_run(isolated: Path) -> None:
    from hpc_grpo.job.eval_job import log_wandb

    spec = resolve_spec("tiny-gsm8k", "local", [f"cluster.runs_root={isolated / 'runs'}"], run_name="nowb")
    spec.path.mkdir(parents=True)
    log_wandb(spec, {"step": 1, "metrics": {}, "problems_per_s": 1.0})
    assert not (spec.path / "wandb").exists()
