"""Compatibility shims: old names hpc-grpo still answers to, each listed with what needs it and when it goes.

The rule: a shim stays only as long as a live run can still need it. A run queued before a rename keeps old names in
files hpc-grpo does not rewrite: submitit's pickles of the job callable (unpickled when the job starts or requeues),
the verl overrides frozen in its scripts (`pkg://` reward paths), the lock records its jobs write, and users' own
recipe files. Each shim's end date leaves a queued, requeued or chained job of the old layout time to end (two
months past the change); on that date the shim and its row go. Nothing in hpc_grpo imports a shim module
(tests/unit/test_import_rules.py), and tests/unit/test_compat.py checks each row: a module still re-exports what it
lists from its new home, an alias is still the one config.keys accepts, and no shim is past its end date.
Plain data, imports nothing (layer: common).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date

MODULE, KEY, RECORD = "module", "recipe key", "lock record"


@dataclass(frozen=True)
class Shim:
    """One old name. `old` is a module path (MODULE), a dotted recipe key (KEY) or a file format (RECORD); `new` is
    where the thing lives now; `names` are what a module shim re-exports from `new`."""

    old: str
    kind: str
    new: str
    needed_by: str
    until: date
    names: tuple[str, ...] = ()


RESHAPE_END = date(2027, 2, 4)  # the package re-shape (2026-12-04) + two months

SHIMS: tuple[Shim, ...] = (
    Shim("hpc_grpo.submit", MODULE, "hpc_grpo.launch.submit",
         "training jobs queued before the re-shape: their submitit folders pickle hpc_grpo.submit.TrainJob",
         RESHAPE_END, ("TrainJob",)),
    Shim("hpc_grpo.evaluate", MODULE, "hpc_grpo.evaluation.evaluate",
         "eval jobs queued before the re-shape: their submitit folders pickle hpc_grpo.evaluate.EvalJob",
         RESHAPE_END, ("EvalJob",)),
    Shim("hpc_grpo.code_reward", MODULE, "hpc_grpo.rewards.code",
         "verl runs rendered before the re-shape: their frozen overrides name pkg://hpc_grpo.code_reward",
         RESHAPE_END, ("compute_score",)),
    Shim("hpc_grpo.rewards", MODULE, "hpc_grpo.rewards.gsm8k",
         "verl runs rendered before the re-shape: their frozen overrides name pkg://hpc_grpo.rewards (GSM8K's scorer)",
         RESHAPE_END, ("compute_score",)),
    Shim("checkpoint.keep", KEY, "checkpoint.keep_last",
         "recipe files written before retention (2026-12-03), and the specs frozen in runs created before it; "
         "renamed in config.keys.rename_old_keys, nowhere else",
         date(2027, 2, 3)),
    Shim("'HOST pid N' checkpoint-lock record", RECORD, "hpc_grpo.runstate.runs (JSON lease record)",
         "jobs started before the lease lock (2026-12-04) that still hold a run's lock: runs._read_holder reads "
         "their record's host and pid",
         RESHAPE_END),
)


def modules() -> frozenset[str]:
    """The module shims' names: what nothing in hpc_grpo may import."""
    return frozenset(s.old for s in SHIMS if s.kind == MODULE)
