"""The job watches its own first steps: runstate/health over the metric rows as the trainer logs them.

Why: a broken run (a weight sync that never reaches vLLM, a NaN, a reward that is always 0, a collapsed entropy)
shows it in its first steps, while its reward curve only stays flat for hours. Each finding, once per kind, becomes:
- a line in the job's log, starting with PREFIX;
- a W&B alert on the run's W&B run, where the recipe logs to W&B (trl: the trainer's own run; verl: the job attaches
  to the same run id, which its TaskRunner writes, as a second writer);
- where `health.stop_on` names it, a clean stop: the reason in the run's history (a "failed" event, so status shows
  it and the run is not trained), a checkpoint (trl: the save-on-signal request; verl: its newest periodic save),
  and `hpc-grpo resume` carries on from that checkpoint.
status and watch show the same findings from the run's metric files (runstate/health), job or no job.

verl: a thread beside the driver (job/verl_node) reads verl's file logger (RUN/verl_metrics.jsonl, written per step
and rewritten from scratch by each start: rows older than this driver are ignored). trl: job/trl_job calls `check`
from its metrics callback.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Self

from hpc_grpo.cluster.job_env import job_identity
from hpc_grpo.config.spec import RunSpec
from hpc_grpo.runstate import checkpoints as ck
from hpc_grpo.runstate import layout, runs
from hpc_grpo.runstate.health import Health, run_health
from hpc_grpo.runstate.metrics import file_rows, read_raw

PREFIX = "health finding:"  # after the job's own prefix: `hpc-grpo: [time] health finding: ...`
# The exit status of a training process (trl) or node (verl) stopped by a finding health.stop_on names.
HEALTH_STOPPED = 3
POLL_S = 1.0
CHECKPOINT_WAIT_S = 120.0  # verl: how long a stop waits for the flagged step's periodic save to complete


def _print(line: str) -> None:
    print(line, file=sys.stdout, flush=True)


class Watcher:
    """Each new finding once (by kind): a job-log line and a W&B alert; the first finding `health.stop_on` names is
    the stop (recorded in the run's history by `record_stop`)."""

    def __init__(self, spec: RunSpec, say: Callable[[str], None] = _print,
                 alert: Callable[[Health, bool], None] | None = None, after_step: int = 0) -> None:
        self.spec = spec
        self.after_step = after_step  # a resumed job judges its own steps (verl's file logger holds only those)
        self.stop_on = set(spec.recipe.health.stop_on)
        self.say = say
        self.alert = alert
        self.seen: set[str] = set()
        self.stop: Health | None = None

    def check(self, rows: list[dict[str, Any]]) -> Health | None:
        """The rows logged so far (our names, by step); the stop finding when this look found it, else None."""
        found = None
        for h in run_health([r for r in rows if r["step"] > self.after_step]):
            if h.kind in self.seen:
                continue
            self.seen.add(h.kind)
            stops = h.kind in self.stop_on and self.stop is None
            then = (f"health.stop_on names {h.kind}: saving and stopping the job" if stops else
                    f"training goes on (health.stop_on: [{h.kind}] would stop it)")
            self.say(f"{PREFIX} {h.kind}: {h.message}; {then}")
            if self.alert is not None:
                try:
                    self.alert(h, stops)
                except Exception as exc:  # noqa: BLE001 - an alert that cannot be sent must not end the job
                    self.say(f"{PREFIX} the W&B alert for {h.kind} was not sent: {type(exc).__name__}: {exc}")
            if stops:
                self.stop = found = h
        return found

    def record_stop(self, run_dir: Path, checkpoint: str) -> None:
        """The reason in the run's history (status: "stopped by health: ..."; the run is not trained)."""
        h = self.stop
        if h is None:
            return
        job_id, executor = job_identity()
        note = f"{h.stop_reason}; {checkpoint}; `hpc-grpo resume` carries on from it"
        try:
            runs.append_history(run_dir, job_id, "failed", executor, note=note,
                                data={"cause": "health", "kind": h.kind, "step": h.step})
        except OSError as exc:
            self.say(f"{PREFIX} could not record the stop in {layout.HISTORY_FILE}: {exc}")


class WandbAlert:
    """W&B alerts on the run's W&B run. In a process without one (verl's job process: its TaskRunner holds the
    run), the first alert attaches to the same run id: W&B's shared mode as a second writer when online, an offline
    run of the same id beside verl's when W&B is offline (synced into the one run). `close` ends what it attached."""

    def __init__(self, spec: RunSpec) -> None:
        self.spec = spec
        self.attached: Any = None

    def _run(self) -> Any:
        import wandb

        if wandb.run is not None:
            return wandb.run
        if self.attached is None:
            run_dir = self.spec.path
            offline = os.environ.get("WANDB_MODE") in ("offline", "dryrun")
            settings = (wandb.Settings(mode="offline") if offline else
                        wandb.Settings(mode="shared", x_primary=False, x_label="hpc-grpo-health",
                                       x_update_finish_state=False))
            self.attached = wandb.init(id=runs.wandb_run_id(run_dir), project=self.spec.recipe.logging.project,
                                       group=self.spec.recipe.logging.group, dir=str(run_dir), resume="allow",
                                       settings=settings)
        return self.attached

    def __call__(self, h: Health, stops: bool) -> None:
        level = "ERROR" if stops else "WARN"  # wandb.AlertLevel's values
        self._run().alert(title=f"hpc-grpo health: {h.kind} at step {h.step}", text=h.message, level=level,
                          wait_duration=0)

    def close(self) -> None:
        if self.attached is not None:
            self.attached.finish()
            self.attached = None


def alerter(spec: RunSpec) -> WandbAlert | None:
    """The W&B alert where the recipe logs to W&B, else None."""
    return WandbAlert(spec) if "wandb" in spec.recipe.logging.logger else None


def file_state(path: Path) -> tuple[int, int, int] | None:
    """What changes when verl (re)writes its file logger: inode, size, mtime (ns); None while there is none."""
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_ino, st.st_size, st.st_mtime_ns


class FreshRows:
    """verl's file-logger rows once this driver has (re)written the file: verl truncates it at each start, so until
    it changes from what it was when the job started, its rows are a former start's (compared by the file's own
    state, not by clocks: a shared filesystem's server may not keep the node's time)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.before = file_state(path)
        self.fresh = False

    def _fresh(self) -> bool:
        if not self.fresh:
            now = file_state(self.path)
            self.fresh = now is not None and now != self.before
        return self.fresh

    def rows(self) -> list[dict[str, Any]]:
        """Our names (runstate/metrics), by step."""
        return file_rows(self.path) if self._fresh() else []

    def raw(self) -> dict[int, dict[str, Any]]:
        """step -> verl's own keys (val-core/... included)."""
        return read_raw(self.path) if self._fresh() else {}


def _checkpoint_for(spec: RunSpec, step: int, deadline: float, done: Callable[[], bool]) -> str:
    """verl (no save hook): the flagged step's own checkpoint where checkpoint.save_freq makes it a save step (verl
    saves a step before it logs it: waited for, bounded, in case the save is still being completed), else the
    newest one; what the run resumes from, in words."""
    freq = spec.recipe.checkpoint.save_freq
    due = freq > 0 and step % freq == 0
    while True:
        newest = ck.newest_complete(ck.list_checkpoints(spec.path, spec.recipe.engine))
        if newest is not None and newest.step >= step:
            return f"checkpoint step {newest.step} saved"
        if not due or time.monotonic() >= deadline or done():
            break
        time.sleep(POLL_S)
    if newest is None:
        return "no checkpoint saved yet (checkpoint.save_freq): a resume starts from the beginning"
    return f"the newest checkpoint is step {newest.step} (checkpoint.save_freq)"


class RowWatch:
    """A thread beside verl's driver that looks at the driver's rows every poll_s until `look` finds something, then
    hands it to `act` once; `stop_reason`, once set, is polled by the driver watch (job/driver_watch), which stops
    the driver. The health watch and the early stop are both one."""

    name = "row-watch"
    what = "watch"  # log prefix of a failed look

    def __init__(self, log: Callable[[str], None], poll_s: float, checkpoint_wait_s: float) -> None:
        self.log = log
        self.poll_s = poll_s
        self.checkpoint_wait_s = checkpoint_wait_s
        self.stop_reason: str | None = None
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, name=self.name, daemon=True)

    def look(self) -> Any:
        raise NotImplementedError

    def act(self, found: Any) -> None:
        raise NotImplementedError

    def start(self) -> Self:
        self.thread.start()
        return self

    def _run(self) -> None:
        while not self.done.is_set():
            try:
                found = self.look()
            except Exception as exc:  # noqa: BLE001 - a failed look must not end the watching
                self.log(f"{self.what} {type(exc).__name__}: {exc}")
                found = None
            if found is not None:
                self.act(found)
                return
            self.done.wait(self.poll_s)

    def close(self) -> None:
        self.done.set()
        self.thread.join(timeout=10)


class VerlHealth(RowWatch):
    """The verl side: a thread that follows the driver's metric rows; `stop_reason` is polled by the driver watch
    (job/driver_watch) and, once set, the driver is stopped."""

    name = "health-watch"
    what = PREFIX

    def __init__(self, spec: RunSpec, log: Callable[[str], None], poll_s: float = POLL_S,
                 checkpoint_wait_s: float = CHECKPOINT_WAIT_S) -> None:
        self.spec = spec
        self.alert = alerter(spec)
        self.watcher = Watcher(spec, say=log, alert=self.alert)
        self.rows = FreshRows(layout.verl_log(spec.path))
        super().__init__(log, poll_s, checkpoint_wait_s)

    def look(self) -> Health | None:
        return self.watcher.check(self.rows.rows())

    def act(self, found: Health) -> None:
        what = _checkpoint_for(self.spec, found.step, time.monotonic() + self.checkpoint_wait_s, self.done.is_set)
        self.watcher.record_stop(self.spec.path, what)
        self.stop_reason = f"{found.stop_reason}; {what}"

    def close(self) -> None:
        super().close()
        if self.alert is not None:
            try:
                self.alert.close()
            except Exception as exc:  # noqa: BLE001
                self.log(f"{PREFIX} W&B: {exc}")
