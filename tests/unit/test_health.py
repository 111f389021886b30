"""runstate/health: the problems a run's metric rows show, at the step they are first seen. Rows are the shape
runstate/metrics gives (our names; a logged non-finite value is None), built from verl's own keys through
metrics._pick so a renamed key fails here."""

from __future__ import annotations

import json
from pathlib import Path

from hpc_grpo.runstate import metrics
from hpc_grpo.runstate.health import ROLLOUT_DIFF_MAX, run_health


def _rows(*raw: dict) -> list[dict]:
    return [{"step": i + 1, **metrics._pick(r)} for i, r in enumerate(raw)]


HEALTHY = {"critic/score/mean": 0.3, "actor/pg_loss": 0.01, "actor/grad_norm": 0.5, "actor/entropy": 0.8,
           "training/rollout_probs_diff_mean": 0.0012, "training/rollout_actor_probs_pearson_corr": 0.999}


def test_a_healthy_run_has_no_finding() -> None:
    # the largest drift a healthy learning run showed (HF sampler, 0.0026) is well under the limit
    assert run_health(_rows(*[{**HEALTHY, "training/rollout_probs_diff_mean": 0.0026}] * 16)) == []


def test_a_broken_weight_sync_is_flagged_at_the_step_the_drift_passes_the_limit() -> None:
    drift = [0.002, 0.008, 0.016, 0.015]  # the broken-sync run's drift reached 0.016
    found = run_health(_rows(*[{**HEALTHY, "training/rollout_probs_diff_mean": d} for d in drift]))
    assert [(h.kind, h.step) for h in found] == [("weight_sync", 3)]
    assert "0.016" in found[0].message and str(ROLLOUT_DIFF_MAX) in found[0].message


def test_nan_loss_or_grad_norm_is_flagged_once() -> None:
    rows = _rows(HEALTHY, {**HEALTHY, "actor/grad_norm": float("nan")}, {**HEALTHY, "actor/pg_loss": float("inf")})
    found = run_health(rows)
    assert [(h.kind, h.step) for h in found] == [("nan", 2)] and "grad_norm" in found[0].message


def test_a_reward_of_zero_for_five_steps_and_not_four() -> None:
    four = _rows(*[{**HEALTHY, "critic/score/mean": 0.0}] * 4, HEALTHY)
    assert run_health(four) == []
    five = _rows(HEALTHY, *[{**HEALTHY, "critic/score/mean": 0.0}] * 5)
    assert [(h.kind, h.step) for h in run_health(five)] == [("zero_reward", 6)]


def test_entropy_collapse_needs_three_steps_under_a_tenth_of_the_first() -> None:
    values = [0.8, 0.5, 0.07, 0.05, 0.2, 0.05, 0.04, 0.03]
    found = run_health(_rows(*[{**HEALTHY, "actor/entropy": e} for e in values]))
    assert [(h.kind, h.step) for h in found] == [("entropy_collapse", 8)]


def test_status_reads_the_runs_metrics_file(tmp_path: Path) -> None:
    """The rows come from RUN/metrics.jsonl in verl's file-logger layout, as the prune poller copies them."""
    path = tmp_path / "metrics.jsonl"
    lines = [{"step": s, "data": {**HEALTHY, "training/rollout_probs_diff_mean": d}} for s, d in
             ((1, 0.001), (2, 0.02))]
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    rows = metrics.file_rows(path)
    assert [h.kind for h in run_health(rows)] == ["weight_sync"]
