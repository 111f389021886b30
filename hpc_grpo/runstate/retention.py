"""Checkpoint retention's policy: which checkpoints a run keeps, and why. Pure: no file is read here.

hpc-grpo owns retention (verl's `max_actor_ckpt_to_keep` forgets checkpoints saved before a
restart, deletes only actor/ and never a partial save; trl's save_total_limit is off too). The
policy is `decide`, a pure function from the listed checkpoints and their protections to one
Verdict each; hpc_grpo.runstate.prune lists the checkpoints, decides with this module and removes
under the run's checkpoint lock. Readers hold a checkpoint with a lease (hpc_grpo.runstate.leases).
"""

from __future__ import annotations

import fnmatch
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from hpc_grpo.config.spec import Checkpoint

_RECIPE = Checkpoint()  # the recipe's defaults: set once, in the spec; a Policy built in code takes the same

@dataclass(frozen=True, slots=True)
class Policy:
    """What prune keeps; the defaults are the recipe's checkpoint section's (from_recipe for a run's own)."""

    keep_last: int = _RECIPE.keep_last
    keep_every: int | None = None
    keep_best: str | None = None  # metric name (fnmatch pattern allowed)
    best_mode: str = "max"
    max_bytes: int | None = None
    grace_s: float = float(_RECIPE.grace_s)
    quarantine_s: float = _RECIPE.quarantine_days * 86400.0

    @classmethod
    def from_recipe(cls, ckpt: Any, **overrides: Any) -> Policy:
        """The recipe's checkpoint section, with command-line overrides (None = not given)."""
        best = overrides.pop("keep_best", None) or ckpt.keep_best
        metric, mode = split_best(best)
        base = cls(keep_last=ckpt.keep_last, keep_every=ckpt.keep_every, keep_best=metric, best_mode=mode,
                   max_bytes=ckpt.max_bytes, grace_s=float(ckpt.grace_s), quarantine_s=ckpt.quarantine_days * 86400)
        return replace(base, **{k: v for k, v in overrides.items() if v is not None})


def split_best(value: str | None) -> tuple[str | None, str]:
    if not value:
        return None, "max"
    metric, _, mode = value.rpartition(":") if value.endswith((":max", ":min")) else (value, "", "max")
    return metric, mode or "max"


@dataclass(frozen=True, slots=True)
class Item:
    """One checkpoint as prune sees it; complete is None when it was not opened (its verdict does not depend on it)."""

    step: int
    path: Path
    complete: bool | None
    reason: str
    size_bytes: int
    mtime: float
    export_bytes: int = 0


@dataclass(frozen=True, slots=True)
class Protections:
    now: float
    tracker_step: int | None = None
    leased: frozenset[int] = frozenset()
    metrics: dict[int, float] = field(default_factory=dict)  # step -> value of the keep-best metric


@dataclass(frozen=True, slots=True)
class Verdict:
    step: int
    path: Path
    keep: bool
    reason: str
    protected: bool
    complete: bool | None
    size_bytes: int
    export_bytes: int

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["path"] = str(self.path)
        return d


def best_step(items: Sequence[Item], prot: Protections, policy: Policy) -> int | None:
    """The complete checkpoint with the best metric (ties: the newest)."""
    scored = [(prot.metrics[i.step], i.step) for i in items if i.complete and i.step in prot.metrics]
    if not scored:
        return None
    pick = max(scored) if policy.best_mode == "max" else min(scored, key=lambda t: (t[0], -t[1]))
    return pick[1]


def decide(items: Sequence[Item], policy: Policy, prot: Protections) -> list[Verdict]:
    """One verdict per checkpoint, oldest first. Pure: no file is read.

    Hard protections (never removed, max_bytes included): the newest complete checkpoint, the tracker's step,
    a leased step, one younger than grace_s, an incomplete one newer than the newest complete (a save under way,
    or a crash resume preparation sets aside). Then keep_last / keep_every / keep_best; incomplete ones older than
    the newest complete go; max_bytes drops the oldest soft-kept ones (milestones, then keep-last, then best).
    """
    items = sorted(items, key=lambda i: i.step)
    complete = [i for i in items if i.complete]
    newest = complete[-1].step if complete else None
    hard: dict[int, str] = {}
    for i in items:
        why = []
        if i.complete and i.step == newest:
            why.append("newest complete checkpoint")
        if prot.tracker_step is not None and i.step == prot.tracker_step:
            why.append("verl's tracker names this step")
        if i.step in prot.leased:
            why.append("leased by a reader (evaluation/export)")
        age = prot.now - i.mtime
        if age < policy.grace_s:
            why.append(f"written {max(age, 0):.0f}s ago (grace {policy.grace_s:.0f}s)")
        if i.complete is False and (newest is None or i.step > newest):
            why.append(f"incomplete, newer than the newest complete one ({i.reason})")
        if why:
            hard[i.step] = "; ".join(why)
    soft: dict[int, tuple[int, str]] = {}  # step -> (drop priority: lower goes first under max_bytes, reason)
    for i in complete[::-1][: policy.keep_last]:
        soft[i.step] = (1, f"one of the {policy.keep_last} newest complete")
    if policy.keep_every:
        for i in complete:
            if i.step % policy.keep_every == 0 and i.step not in soft:
                soft[i.step] = (0, f"milestone (every {policy.keep_every} steps)")
    best = best_step(items, prot, policy) if policy.keep_best else None
    if best is not None:
        soft[best] = (2, f"best {policy.keep_best}={prot.metrics[best]:.4g} ({policy.best_mode})")

    keep: dict[int, str] = {}
    removed: dict[int, str] = {}
    for i in items:
        if i.step in hard:
            keep[i.step] = hard[i.step]
        elif i.step in soft:
            keep[i.step] = soft[i.step][1]
        elif i.complete is False:
            removed[i.step] = f"incomplete, older than the newest complete step {newest} ({i.reason})"
        else:
            note = "" if i.complete else " (not opened: removed either way)"
            removed[i.step] = f"not among the {policy.keep_last} newest complete, no milestone, not the best{note}"
    if policy.max_bytes is not None:
        by_step = {i.step: i for i in items}
        total = sum(by_step[s].size_bytes + by_step[s].export_bytes for s in keep)
        order = sorted((soft[s][0], s) for s in keep if s not in hard)
        for _, s in order:
            if total <= policy.max_bytes:
                break
            total -= by_step[s].size_bytes + by_step[s].export_bytes
            removed[s] = f"over max_bytes {policy.max_bytes}: {keep.pop(s)}, but oldest of its kind"
    return [
        Verdict(i.step, i.path, i.step in keep, keep.get(i.step) or removed[i.step], i.step in hard, i.complete,
                i.size_bytes, i.export_bytes)
        for i in items
    ]


def decide_quarantine(entries: Sequence[tuple[Path, float, int]], policy: Policy, now: float) -> list[Verdict]:
    """checkpoints-incomplete/ entries (path, time set aside, bytes): removed once older than quarantine_s."""
    out = []
    for path, since, size in entries:
        age = now - since
        gone = age > policy.quarantine_s
        why = (f"set aside {age / 86400:.1f} days ago (retention {policy.quarantine_s / 86400:g} days)")
        out.append(Verdict(-1, path, not gone, why, False, False, size, 0))
    return out


def metric_per_checkpoint(logged: dict[int, dict[str, float]], steps: Sequence[int], metric: str) -> dict[int, float]:
    """A checkpoint's value: the metric logged at its step, else the last one logged since the previous checkpoint.
    `metric` may be an fnmatch pattern (val-core/*/reward/mean@1); it must match one key per step."""
    def value(row: dict[str, float]) -> float | None:
        if metric in row:
            return row[metric]
        hits = [k for k in row if fnmatch.fnmatchcase(k, metric)]
        return row[hits[0]] if len(hits) == 1 else None

    out: dict[int, float] = {}
    prev = -1
    for s in sorted(steps):
        found = [(ls, v) for ls, row in logged.items() if prev < ls <= s and (v := value(row)) is not None]
        if found:
            out[s] = max(found)[1]
        prev = s
    return out
