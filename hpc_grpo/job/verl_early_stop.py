"""train.early_stop for verl: a thread beside the driver feeds verl's validation rows to the plateau rule.

Why here: verl's trainer has no hook between steps; it validates every train.test_freq steps and logs the
val-core/... keys in its file logger (RUN/verl_metrics.jsonl, rewritten by each start), after the step's periodic
save. Plan requires checkpoint.save_freq to divide train.test_freq, so the plateau step is a saved one. On a
plateau the thread waits for that checkpoint, then `stop_reason` is set; the driver watch (job/driver_watch) stops
the driver, and `mark_trained` writes train_done.json with the early_stop record and a "stopped" history line, as
the trl job does, so the job exits 0 and its chained eval runs. A requeued or resumed job first replays the
validations in RUN/metrics.jsonl up to the step it resumes from.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from hpc_grpo.common.atomic import write_json_atomic
from hpc_grpo.config.spec import RunSpec
from hpc_grpo.config.steps import total_steps
from hpc_grpo.job.early_stop import Plateau
from hpc_grpo.job.health_watch import CHECKPOINT_WAIT_S, POLL_S, FreshRows, RowWatch
from hpc_grpo.runstate import checkpoints as ck
from hpc_grpo.runstate import layout, runs
from hpc_grpo.runstate.metrics import read_raw


def replayed(spec: RunSpec, up_to: int) -> Plateau:
    """The rule's state at this start: the validations logged up to the resumed step (later rows were a lost
    future the driver repeats)."""
    rule = spec.recipe.train.early_stop
    assert rule is not None
    plateau = Plateau(rule)
    plateau.feed(read_raw(layout.metrics_file(spec.path)), until=up_to)
    return plateau


class VerlEarlyStop(RowWatch):
    """Follows the driver's rows; `stop_reason` is polled by the driver watch and, once set, the driver is
    stopped (its plateau step's checkpoint saved)."""

    name = "early-stop-watch"
    what = "early stopping:"

    def __init__(self, spec: RunSpec, log: Callable[[str], None], poll_s: float = POLL_S,
                 checkpoint_wait_s: float = CHECKPOINT_WAIT_S) -> None:
        super().__init__(log, poll_s, checkpoint_wait_s)
        self.spec = spec
        self.t0 = time.time()
        resumed = ck.newest_complete(ck.list_checkpoints(spec.path, "verl"))
        self.resumed_from = str(resumed.path) if resumed is not None else None
        self.after = resumed.step if resumed is not None else -1  # -1: val_before_train logs step 0
        self.plateau = replayed(spec, self.after)
        if self.plateau.seen:
            log(f"early stopping: {len(self.plateau.seen)} earlier validation(s) replayed, best "
                f"{self.plateau.best:.4g} at step {self.plateau.best_step}, {self.plateau.since_best} since")
        self.rows = FreshRows(layout.verl_log(spec.path))
        self.missing_said = False
        self.step: int | None = None  # the plateau step, once found
        self.checkpoint: ck.Checkpoint | None = None

    def look(self) -> int | None:
        """Feed the rows logged since the last look; the plateau step when this look found it."""
        raw = self.rows.raw()
        new = {s: r for s, r in raw.items() if s > self.after}
        if not new:
            return None
        self.after = max(new)
        self._say_missing(new)
        return self.plateau.feed(new)

    def _say_missing(self, new: dict[int, dict[str, Any]]) -> None:
        """A validation row without the metric: the recipe names a key verl does not log (said once)."""
        metric = self.plateau.rule.metric
        for row in new.values():
            val = sorted(k for k in row if k.startswith("val-"))
            if val and metric not in row and not self.missing_said:
                self.missing_said = True
                self.log(f"early stopping: train.early_stop.metric={metric} is not among verl's validation metrics "
                         f"({', '.join(val)}): no early stop in this job; set it to one of them")

    def act(self, step: int) -> None:
        """Wait (bounded) for the plateau step's checkpoint, then ask for the stop."""
        self.log(self.plateau.reason(step) + f": waiting for checkpoint step {step}, then stopping the driver")
        deadline = time.monotonic() + self.checkpoint_wait_s
        while True:
            saved = [c for c in ck.list_checkpoints(self.spec.path, "verl") if c.complete and c.step == step]
            if saved or time.monotonic() >= deadline or self.done.is_set():
                break
            time.sleep(self.poll_s)
        if not saved:  # plan makes the step a save step; without its checkpoint the run goes on, not trained early
            self.log(f"early stopping: checkpoint step {step} is not complete after {self.checkpoint_wait_s:.0f} s: "
                     "training goes on")
            return
        self.step, self.checkpoint = step, saved[0]
        self.stop_reason = self.plateau.reason(step)

    def mark_trained(self) -> dict[str, Any]:
        """After the driver stopped on the plateau: train_done.json (the early_stop record; the run is trained, its
        eval follows) and the "stopped" history line, as the trl job writes them."""
        from hpc_grpo.cluster.job_env import job_identity

        assert self.step is not None and self.checkpoint is not None
        run_dir = self.spec.path
        early = self.plateau.as_dict(self.step)
        job_id, executor = job_identity()
        runs.append_history(run_dir, job_id, "stopped", executor, note=str(early["reason"]), data=early)
        done: dict[str, Any] = {
            "run_name": self.spec.run_name,
            "final_step": self.step,
            "max_steps": total_steps(self.spec, None)[0],
            "last_checkpoint": str(self.checkpoint.path),
            "resumed_from": self.resumed_from,
            "wall_time_s": round(time.time() - self.t0, 3),
            "train_runtime_s": round(time.time() - self.t0, 3),
            "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "early_stop": early,
        }
        # A save the driver began after the plateau step (before it was stopped) is not the run's: moved aside,
        # so the eval (the newest complete checkpoint) and prune see the plateau step as the last.
        with runs.checkpoint_lock(run_dir, timeout_s=600):
            for c in ck.list_checkpoints(run_dir, "verl"):
                if c.step > self.step:
                    self.log(f"early stopping: checkpoint step {c.step} began after the plateau step; moved to "
                             f"{ck.quarantine(run_dir, c)}")
        write_json_atomic(layout.done_file(run_dir), done)
        self.log(f"done: {early['reason']}; last checkpoint {done['last_checkpoint']}")
        return done
