"""A run's health from its own metric rows: what a broken run shows in its first steps, before its reward does.

A pure function over the rows of runstate/metrics (our names, by step), for status, watch and monitor:

- weight_sync: the rollout is not the policy being trained (the weights or the LoRA adapter did not reach vLLM).
  verl compares each sampled token's probability under vLLM with the trainer's every step; SYNC_SIGNALS are its
  three numbers and their limits, and a step is flagged when at least two of those it logged are past their limits
  (the one, when it logged one): one number past its limit is no alarm. The limits, from verl on CPU with vLLM
  (docs/benchmarks.md, "Health"): 10 healthy runs on every engine (FSDP LoRA and full weights, 16 steps each;
  Megatron TP 2 and PP 2 on 2 Slurm nodes, 12 steps, one across a preemption; shorter ones) stayed at
  `training/rollout_probs_diff_mean` 2.8e-4 to 5.8e-3 (Megatron PP 2 climbing steadily to step 12; the others
  2.7e-3 or less), `training/rollout_actor_probs_pearson_corr` 0.9970 or more and `rollout_corr/kl` 0.0065 or less;
  the LoRA run with the sync broken on purpose (engines/sync_break) matches at step 1 (a new adapter is the base
  model) and shows 0.0058 / 0.92 / 0.098 at step 2 and 0.0078 / 0.68 / 0.29 at step 3 (two more runs of it:
  0.0046 / 0.94 / 0.11 and 0.0060 / 0.89 / 0.070 at step 2). The limits: 0.005, 0.99 and 0.02. The diff mean
  alone does not separate the two (the healthy PP 2 run passed 0.005, a broken run's step 2 did not): the
  correlation and the KL do, by 3x or more on either side, hence the vote of two.
- nan: a loss, grad norm, KL or entropy that is logged but not a finite number.
- zero_reward: a mean reward of exactly 0 for ZERO_REWARD_STEPS logged steps in a row (every sample scored 0: a
  reward function that never matches, a wrong data column).
- entropy_collapse: entropy under ENTROPY_COLLAPSE of its first logged value for ENTROPY_STEPS steps in a row (the
  policy samples one answer; GRPO's groups then have no spread to learn from).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from hpc_grpo.config.spec import HEALTH_KINDS

ROLLOUT_DIFF_MAX = 0.005
ROLLOUT_CORR_MIN = 0.99
ROLLOUT_KL_MAX = 0.02
# (our metric name, verl's key, "above" or "below", the limit): past the limit is a vote for weight_sync
SYNC_SIGNALS = (("rollout_probs_diff", "rollout_probs_diff_mean", "above", ROLLOUT_DIFF_MAX),
                ("rollout_probs_corr", "rollout_actor_probs_pearson_corr", "below", ROLLOUT_CORR_MIN),
                ("rollout_kl", "rollout_corr/kl", "above", ROLLOUT_KL_MAX))
ZERO_REWARD_STEPS = 5
ENTROPY_COLLAPSE = 0.1
ENTROPY_STEPS = 3
FINITE_KEYS = ("loss", "grad_norm", "kl", "entropy")
KINDS = HEALTH_KINDS  # what `health.stop_on` may name (config/spec validates it)


@dataclass(frozen=True)
class Health:
    """One problem: its kind, the step it was first seen at, what to tell the user, and the number that decided it
    (for the run's history: "rollout_probs_diff_mean 0.016 > limit 0.005")."""

    kind: str
    step: int
    message: str
    detail: str = ""

    @property
    def stop_reason(self) -> str:
        """The line the run's history and status keep when this finding stopped the job."""
        return f"stopped by health: {self.kind} at step {self.step}" + (f" ({self.detail})" if self.detail else "")


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def _first_run(rows: list[dict[str, Any]], test: Any, length: int) -> int | None:
    """The step that ends the first `length` rows in a row where test(row) holds, or None."""
    count = 0
    for row in rows:
        count = count + 1 if test(row) else 0
        if count >= length:
            return int(row["step"])
    return None


def _sync_votes(row: dict[str, Any]) -> list[str] | None:
    """The sync signals past their limits at this step when they decide weight_sync (see the module doc), else None."""
    logged, past = 0, []
    for name, key, side, limit in SYNC_SIGNALS:
        value = _number(row.get(name))
        if value is None:
            continue
        logged += 1
        if (value > limit) if side == "above" else (value < limit):
            past.append(f"{key} {value:.3g} {'>' if side == 'above' else '<'} limit {limit}")
    return past if past and len(past) >= min(2, logged) else None


def run_health(rows: list[dict[str, Any]]) -> list[Health]:
    """Every problem the rows show, each once, at the first step it is seen (see the module doc)."""
    found: list[Health] = []
    for row in rows:
        past = _sync_votes(row)
        if past is not None:
            found.append(Health("weight_sync", int(row["step"]), (
                f"step {row['step']}: the rollout is not the policy being trained: vLLM's token probabilities are "
                f"not the trainer's ({'; '.join(past)}): the weights or the LoRA adapter did not reach vLLM"),
                ", ".join(past)))
            break
    for row in rows:
        bad = [k for k in FINITE_KEYS if k in row and (row[k] is None or not math.isfinite(_number(row[k]) or 0.0))]
        if bad:
            found.append(Health("nan", int(row["step"]), f"step {row['step']}: {', '.join(bad)} is not a finite "
                                "number (NaN or infinite): the update diverged; lower the learning rate or check "
                                "the data", f"{', '.join(bad)} not finite"))
            break
    zero = _first_run(rows, lambda r: _number(r.get("reward")) == 0.0, ZERO_REWARD_STEPS)
    if zero is not None:
        found.append(Health("zero_reward", zero, f"step {zero}: the mean reward has been 0 for {ZERO_REWARD_STEPS} "
                            "steps in a row: every sample scores 0 (the reward never matches: check the reward "
                            "function and the data's answer column)",
                            f"mean reward 0 for {ZERO_REWARD_STEPS} steps"))
    entropies = [(_number(r.get("entropy")), r) for r in rows]
    first = next((e for e, _ in entropies if e is not None and e > 0), None)
    if first is not None:
        collapsed = _first_run(rows, lambda r: (_number(r.get("entropy")) is not None
                                                and _number(r.get("entropy")) < ENTROPY_COLLAPSE * first),  # type: ignore[operator]
                               ENTROPY_STEPS)
        if collapsed is not None:
            found.append(Health("entropy_collapse", collapsed, f"step {collapsed}: entropy fell under "
                                f"{ENTROPY_COLLAPSE:.0%} of its first value ({first:.3g}) for {ENTROPY_STEPS} steps: "
                                "the policy samples one answer, and GRPO's groups have nothing to compare",
                                f"entropy < {ENTROPY_COLLAPSE:.0%} of {first:.3g} for {ENTROPY_STEPS} steps"))
    return found
