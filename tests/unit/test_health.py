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


# verl's three sync numbers per step (diff mean, Pearson correlation, rollout KL), as logged by real runs
# (docs/benchmarks.md, "Health"): the extremes of 8 healthy runs on every engine, and the LoRA run with the weight
# sync broken on purpose (engines/sync_break), steps 1-4.
HEALTHY_EXTREMES = [(0.0027, 0.9986, 0.0043), (0.00028, 0.9996, 0.0011), (0.0025, 0.9994, 0.0020),
                    (0.0058, 0.9990, 0.0015), (0.0018, 0.9970, 0.0065)]  # Megatron PP 2: steps 12, 5 and 6
BROKEN_LORA = [(0.00038, 0.9996, 0.0011), (0.0058, 0.921, 0.098), (0.0078, 0.676, 0.286), (0.0090, 0.579, 0.551)]


def _sync(diff: float, corr: float, kl: float) -> dict:
    return {**HEALTHY, "training/rollout_probs_diff_mean": diff, "training/rollout_actor_probs_pearson_corr": corr,
            "rollout_corr/kl": kl}


def test_a_healthy_run_has_no_finding() -> None:
    # the worst of each number the healthy runs showed, all at once (the diff mean's worst, 0.0058, is past its
    # limit: the other two numbers keep it from being an alarm), and each run's own extremes
    assert run_health(_rows(*[_sync(0.0058, 0.9970, 0.0065)] * 16)) == []
    assert run_health(_rows(*[_sync(*x) for x in HEALTHY_EXTREMES * 5])) == []


def test_a_broken_weight_sync_is_flagged_at_step_2() -> None:
    found = run_health(_rows(*[_sync(*x) for x in BROKEN_LORA]))
    assert [(h.kind, h.step) for h in found] == [("weight_sync", 2)]
    assert "0.0058" in found[0].message and f"limit {ROLLOUT_DIFF_MAX}" in found[0].message
    assert found[0].stop_reason.startswith(f"stopped by health: weight_sync at step 2 (rollout_probs_diff_mean "
                                           f"0.0058 > limit {ROLLOUT_DIFF_MAX}, ")


def test_one_number_past_its_limit_is_no_alarm_when_the_others_are_logged_and_healthy() -> None:
    assert run_health(_rows(_sync(0.0062, 0.9990, 0.003), _sync(0.003, 0.985, 0.003))) == []
    # the one number logged decides alone
    alone = {**HEALTHY, "training/rollout_probs_diff_mean": 0.02}
    del alone["training/rollout_actor_probs_pearson_corr"]
    assert [h.kind for h in run_health(_rows(alone))] == ["weight_sync"]


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
    lines = [{"step": s, "data": _sync(*x)} for s, x in ((1, BROKEN_LORA[0]), (2, BROKEN_LORA[2]))]
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    rows = metrics.file_rows(path)
    assert [h.kind for h in run_health(rows)] == ["weight_sync"]
