"""`hpc-grpo prune-ckpts`: the retention policy (hpc_grpo.runstate.retention) applied to one run or to all, by
hpc_grpo.runstate.prune.

The recipe's checkpoint section is the policy; the command line's options override it for this call only.
Bad options are input errors (SpecError, exit 2) before any run is touched.
"""

from __future__ import annotations

from typing import Any

from hpc_grpo.common.yamlio import SpecError
from hpc_grpo.runstate.prune import PruneResult, prune_run
from hpc_grpo.runstate.retention import Policy


def prune_runs(run: str | None, all_runs: bool, *, dry_run: bool, max_bytes: str | None = None,
               **overrides: Any) -> list[PruneResult]:
    """One run (by name, folder, or the newest), or all of them (`all_runs`); one result each."""
    from hpc_grpo.commands.status import locate_run, runs_roots
    from hpc_grpo.config.resolve import load_frozen
    from hpc_grpo.config.fields import parse_size
    from hpc_grpo.runstate.layout import spec_file
    from hpc_grpo.runstate.runs import find_runs

    if all_runs and run:
        raise SpecError(f"give a run ({run!r}) or --all, not both", key="run")
    if max_bytes is not None:
        try:
            overrides["max_bytes"] = parse_size(max_bytes)
        except ValueError as exc:
            raise SpecError(f"--max-bytes {max_bytes!r} {exc}", key="max_bytes") from None
    if overrides.get("keep_best") is not None:
        from hpc_grpo.config.fields import KEEP_BEST_RE

        if not KEEP_BEST_RE.match(overrides["keep_best"]):
            raise SpecError(f"--keep-best {overrides['keep_best']!r}: use METRIC, METRIC:max or METRIC:min", key="keep_best")
    dirs = find_runs(runs_roots()) if all_runs else [locate_run(run)]
    results = []
    for d in dirs:
        spec = load_frozen(spec_file(d))
        policy = Policy.from_recipe(spec.recipe.checkpoint, **overrides)
        results.append(prune_run(d, spec.recipe.engine, policy, dry_run=dry_run))
    return results
