"""Why a job stopped, and whether the run goes on: the requeue decision, in one pure place.

A USR2 reaches the job for three reasons: the time limit is near (`--signal=USR2@<signal_delay_s>`), a job of a
higher-priority partition preempts it (`preempt_send_user_signal`), or someone ran `scancel --signal=USR2`. Only
the first is bounded (`resources.max_timeout_requeues`): a run that keeps hitting its limit would otherwise queue
forever, while preemption is the cluster's doing and never the run's fault. They are told apart by the time left
in the allocation: Slurm sends the time-limit warning `signal_delay_s` before the end, and up to 60 s earlier
(its timer ticks are coarse); any other USR2 comes with more time left. A job that fails for any other reason is
not requeued: its error would only repeat.

The counts come from the run's history (one "requeue" line per requeue, its note starting with the cause), so
they hold across requeues, chained follow-ons and `hpc-grpo resume`. Stdlib only: status imports it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from hpc_grpo.cluster.states import NODE_FAILURE, PREEMPTION, TIME_LIMIT, resumable_cause
from hpc_grpo.runstate import runs
from hpc_grpo.config.spec import RunSpec
from hpc_grpo.common.yamlio import SpecError

# Slurm's time-limit warning may come this much earlier than asked (slurmctld checks limits about every 30-60 s).
EARLY_SIGNAL_S = 60
# Slack on top of that: job start-up, a busy slurmctld answering squeue.
SLACK_S = 30


@dataclass(frozen=True, slots=True)
class Decision:
    requeue: bool
    cause: str
    reason: str  # for people: goes into the history and `status`


def classify_signal(time_left_s: int | None, signal_delay_s: int) -> str:
    """The cause of a USR2, from the seconds left in the allocation (None: unknown, treated as a time limit,
    the bounded case, so an unknown answer can never requeue a run forever)."""
    if time_left_s is None or time_left_s <= signal_delay_s + EARLY_SIGNAL_S + SLACK_S:
        return TIME_LIMIT
    return PREEMPTION


def timeouts_so_far(history: list[runs.HistoryEntry]) -> int:
    """Requeues of the run caused by a time limit (a requeue line's note starts with its cause)."""
    return sum(1 for e in history if e.purpose == "requeue" and e.note.startswith(TIME_LIMIT))


def decide(cause: str, timeouts: int, max_timeout_requeues: int) -> Decision:
    """Requeue after a preemption or node failure always; after a time limit while fewer than the limit have
    happened; never after anything else. The reason starts with the cause (timeouts_so_far reads it back)."""
    if cause in (PREEMPTION, NODE_FAILURE):
        return Decision(True, cause, f"{cause}: requeued (not counted against resources.max_timeout_requeues)")
    if cause != TIME_LIMIT:
        return Decision(False, cause, f"{cause}: not requeued (only time limits, preemption and node failures are)")
    if timeouts >= max_timeout_requeues:
        return Decision(False, cause, f"{cause} reached {timeouts + 1} times, resources.max_timeout_requeues="
                        f"{max_timeout_requeues}: stopped, not requeued. Raise resources.time or "
                        "resources.max_timeout_requeues, then `hpc-grpo resume`")
    return Decision(True, cause, f"{cause}: requeue {timeouts + 1} of at most {max_timeout_requeues}")


def decide_for_run(run_dir: Path, spec: RunSpec, time_left_s: int | None) -> Decision:
    """The decision on a USR2 inside a job."""
    cause = classify_signal(time_left_s, spec.cluster.signal_delay_s)
    return decide(cause, timeouts_so_far(runs.read_history(run_dir)), spec.recipe.resources.max_timeout_requeues)


def chained_start(predecessor_state: str | None, timeouts: int, max_timeout_requeues: int) -> Decision:
    """Whether a chained follow-on resumes: only after its predecessor ended by TIMEOUT, PREEMPTED or NODE_FAIL
    (and, for TIMEOUT, while the time-limit requeues allow it). Anything else: it exits at once."""
    state = predecessor_state or "UNKNOWN"
    cause = resumable_cause(state)  # hpc_grpo.cluster.states: the one map of Slurm states to restart causes
    if cause is None:
        return Decision(False, f"predecessor {state}", f"predecessor ended {state}: nothing to resume, "
                        "the follow-on exits")
    return decide(cause, timeouts, max_timeout_requeues)


def save_budget_s(signal_delay_s: int) -> float:
    """How long the job waits for the save after a USR2: the signal delay, less a margin for the requeue itself."""
    return max(5.0, signal_delay_s - 5.0)


def check(spec: RunSpec) -> None:
    """Restart settings that cannot work, refused before anything is queued."""
    res, cl = spec.recipe.resources, spec.cluster
    if cl.scheduler == "slurm" and cl.signal_delay_s >= res.time_min * 60:
        raise SpecError(f"cluster.signal_delay_s={cl.signal_delay_s} is not shorter than resources.time={res.time} "
                        f"({res.time_min * 60} s): the time-limit warning would come before the job starts. Lower "
                        "cluster.signal_delay_s or raise resources.time", key="cluster.signal_delay_s")
    if cl.restart == "chain" and cl.scheduler != "slurm":
        raise SpecError(f"cluster.restart=chain needs a Slurm cluster; {cl.name} has scheduler={cl.scheduler}",
                        key="cluster.restart")
