"""Early stopping on a validation plateau (recipe train.early_stop): the decision, apart from any trainer.

Each validation's value is compared with the best so far; a value better by more than min_delta resets the count,
any other adds one; at `patience` the run stops. A requeued or resumed job replays the values logged before its
start (metrics.jsonl), so a preemption does not reset the count. Standard library only: the trl job's callback
and the verl job's watcher (job/verl_early_stop, over verl's metric rows) feed it, and it is tested without a
trainer.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hpc_grpo.config.spec import EarlyStop


@dataclass
class Plateau:
    rule: EarlyStop
    best: float | None = None
    best_step: int | None = None
    since_best: int = 0  # validations since the best one
    seen: list[tuple[int, float]] = field(default_factory=list)

    def improves(self, value: float) -> bool:
        if self.best is None:
            return True
        delta = value - self.best if self.rule.mode == "max" else self.best - value
        return delta > self.rule.min_delta

    def update(self, step: int, value: float) -> bool:
        """Record one validation; True when the run should stop now."""
        self.seen.append((step, value))
        if self.improves(value):
            self.best, self.best_step, self.since_best = value, step, 0
        else:
            self.since_best += 1
        return self.since_best >= self.rule.patience

    def feed(self, rows: dict[int, dict[str, object]], after: int = -1, until: int | None = None) -> int | None:
        """Each row (step -> metrics by the engine's own keys) after step `after` (and up to `until`) that holds the
        metric, in step order; the step at which the run should stop, else None. Rows without the metric (steps
        that did not validate) are skipped."""
        for step in sorted(rows):
            if step <= after or (until is not None and step > until):
                continue
            value = rows[step].get(self.rule.metric)
            if isinstance(value, (int, float)) and not isinstance(value, bool) and self.update(step, float(value)):
                return step
        return None

    @property
    def stop(self) -> bool:
        return self.since_best >= self.rule.patience

    def reason(self, step: int) -> str:
        r = self.rule
        return (f"early stop at step {step}: {r.metric} did not improve by more than {r.min_delta:g} ({r.mode}) in "
                f"{self.since_best} validations; best {self.best:.4g} at step {self.best_step}")

    def as_dict(self, step: int) -> dict[str, object]:
        return {"metric": self.rule.metric, "mode": self.rule.mode, "patience": self.rule.patience,
                "min_delta": self.rule.min_delta, "best": self.best, "best_step": self.best_step,
                "stopped_at": step, "values": [list(v) for v in self.seen], "reason": self.reason(step)}


def rung_cutoff(others: list[float], eta: int, mode: str) -> float | None:
    """The value a member must reach at a rung to go on: the top 1/eta boundary of the values the other members
    logged at that rung so far (linear interpolation between ranks); None when none has reached it yet, so the first
    member at a rung always goes on (asynchronous successive halving: no member waits for the others)."""
    if not others:
        return None
    ordered = sorted(others)
    q = 1 - 1 / eta if mode == "max" else 1 / eta
    pos = q * (len(ordered) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def halved(own: float, others: list[float], eta: int, mode: str) -> tuple[bool, float | None]:
    """(stop this member, the cutoff): stop when its value is worse than the cutoff."""
    cutoff = rung_cutoff(others, eta, mode)
    if cutoff is None:
        return False, None
    return (own < cutoff if mode == "max" else own > cutoff), cutoff
