"""What a Slurm job state means: whether the job still holds an allocation, and why an allocation that ended
was restarted. The one map from Slurm's state words to the causes `status`, the requeue decision and chained
follow-ons speak of. Pure and stdlib only."""

from __future__ import annotations

# The causes of a restart, as the run's history and `status` name them.
TIME_LIMIT = "time limit"
PREEMPTION = "preemption"
NODE_FAILURE = "node failure"

# States in which a job still holds, or will again hold, an allocation: its run must not be started twice.
# PREEMPTED is not here: a job requeued by preemption goes RUNNING -> PENDING in squeue (measured, 22.05), and a
# PREEMPTED row from sacct is either an earlier allocation or a job preempted with PreemptMode=CANCEL (final).
LIVE_STATES: frozenset[str] = frozenset(
    {
        "PENDING",
        "RUNNING",
        "REQUEUED",
        "REQUEUE_HOLD",
        "REQUEUE_FED",
        "CONFIGURING",
        "COMPLETING",
        "SUSPENDED",
        "RESIZING",
        "STOPPED",
        "SIGNALING",
        "STAGE_OUT",
        "RESV_DEL_HOLD",
        "SPECIAL_EXIT",
        "POWER_UP_NODE",
    }
)

# sacct's state of an allocation that ended in a restart -> the cause people recognise
RESTART_CAUSES: dict[str, str] = {"TIMEOUT": TIME_LIMIT, "PREEMPTED": PREEMPTION, "NODE_FAIL": NODE_FAILURE,
                                  "REQUEUED": "requeue", "BOOT_FAIL": "node failure (boot)", "DEADLINE": "deadline"}
# Final states after which a chained follow-on resumes; any other end (FAILED, CANCELLED, OUT_OF_MEMORY,
# COMPLETED...) stops the chain.
RESUMABLE_STATES: frozenset[str] = frozenset({"TIMEOUT", "PREEMPTED", "NODE_FAIL"})


def normalize_state(state: str) -> str:
    """The bare state word: "CANCELLED by 0" -> "CANCELLED", "cancelled+" -> "CANCELLED"."""
    words = state.strip().split()
    return words[0].rstrip("+").upper() if words else "UNKNOWN"


def is_live(state: str) -> bool:
    """True while the job holds or will hold an allocation again (pending, running, requeued, suspended...)."""
    return normalize_state(state) in LIVE_STATES


def resumable_cause(state: str) -> str | None:
    """The cause a chained follow-on resumes after (TIMEOUT, PREEMPTED, NODE_FAIL), else None: the chain stops."""
    return RESTART_CAUSES[state] if state in RESUMABLE_STATES else None
