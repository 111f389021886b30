"""Retention beside verl's driver: `python -m hpc_grpo.job.prune_poller --run-dir RUN_DIR [--once]`.

verl has no save hook, and its own `max_actor_ckpt_to_keep` is off (it forgets checkpoints saved
before a restart and deletes only actor/). So node 0 of a verl job (hpc_grpo.job.verl_node) runs this
poller in a thread next to the driver: it watches the checkpoint folder (entry names and the tracker), applies the run's
policy when a save has landed, and copies verl's file-logger lines (validation metrics for
keep_best) into RUN_DIR/metrics.jsonl, which verl itself rewrites from scratch at every restart.
As a command it exits when the stop file appears or its parent is gone. `--once` prunes once and
exits (job start after resume preparation, and the run's end).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from hpc_grpo.runstate import checkpoints as ck
from hpc_grpo.runstate import layout
from hpc_grpo.runstate.prune import job_prune



def log(message: str) -> None:
    print(f"hpc-grpo: [{time.time():.3f}] {message}", flush=True)


def folder_state(run_dir: Path) -> tuple:
    """What changes when a save lands: the entries of the checkpoint folder and the tracker's text."""
    try:
        names = tuple(sorted(os.listdir(layout.checkpoints_dir(run_dir))))
    except OSError:
        names = ()
    try:
        tracker = ck.tracker_file(run_dir).read_text(encoding="utf-8")
    except OSError:
        tracker = ""
    return names, tracker


def merge_metrics(src: Path, dst: Path, seen: set[bytes]) -> int:
    """Append lines of verl's file logger ({"step", "data"}) not yet in dst; returns how many."""
    try:
        lines = [line for line in src.read_bytes().splitlines() if line.strip()]
    except OSError:
        return 0
    new = []
    for line in lines:
        key = hashlib.sha1(line).digest()
        if key not in seen and line.endswith(b"}"):  # a line verl is still writing has no closing brace yet
            seen.add(key)
            new.append(line)
    if new:
        with dst.open("ab") as fh:
            fh.write(b"".join(line + b"\n" for line in new))
    return len(new)


def seen_lines(dst: Path) -> set[bytes]:
    try:
        return {hashlib.sha1(line).digest() for line in dst.read_bytes().splitlines() if line.strip()}
    except OSError:
        return set()


def prune_once(run_dir: Path, when: str, verl_log: Path | None = None) -> None:
    """Copy verl's new metric lines, then apply the retention policy once. Never raises: a prune never fails a job."""
    try:
        if verl_log:
            dst = layout.metrics_file(run_dir)
            merge_metrics(verl_log, dst, seen_lines(dst))
        job_prune(run_dir, when, log)
    except Exception as exc:  # noqa: BLE001 - retention is housekeeping; the job goes on
        log(f"prune ({when}) failed: {exc}")


def poll(run_dir: Path, interval: float, should_stop: Callable[[], bool], verl_log: Path | None = None) -> None:
    """Until should_stop(): copy verl's metric lines and prune after each save (a change of the checkpoint folder).
    should_stop is asked every 0.2 s, so the poller ends promptly when the driver does."""
    dst = layout.metrics_file(run_dir)
    seen = seen_lines(dst)
    last = folder_state(run_dir)
    log(f"prune poller watching {layout.checkpoints_dir(run_dir)} every {interval:g}s")
    while not should_stop():
        try:
            if verl_log:
                merge_metrics(verl_log, dst, seen)
            state = folder_state(run_dir)
            if state != last:
                job_prune(run_dir, "after a save", log)
                last = folder_state(run_dir)  # its own removals are not a new save
        except Exception as exc:  # noqa: BLE001 - a failed look must not end the polling
            log(f"prune poller: {exc}")
        end = time.monotonic() + interval
        while time.monotonic() < end and not should_stop():
            time.sleep(0.2)


def start_thread(run_dir: Path, interval: float = 20.0, verl_log: Path | None = None
                 ) -> tuple[threading.Thread, threading.Event]:
    """The poller in a daemon thread beside the driver; set the event to stop it (then join the thread)."""
    stop = threading.Event()
    thread = threading.Thread(target=poll, args=(run_dir, interval, stop.is_set, verl_log), name="prune-poller",
                              daemon=True)
    thread.start()
    return thread, stop


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m hpc_grpo.job.prune_poller", description=__doc__.split("\n")[0])
    p.add_argument("--run-dir", required=True, type=Path)
    p.add_argument("--once", action="store_true", help="prune once and exit")
    p.add_argument("--interval", type=float, default=20.0, help="seconds between looks at the folder")
    p.add_argument("--stop-file", type=Path, help="exit when this file exists")
    p.add_argument("--verl-log", type=Path, help=f"verl's file-logger output to copy into {layout.METRICS_FILE}")
    p.add_argument("--when", default="job start", help="label for the log line (--once)")
    args = p.parse_args(argv)
    if args.once:
        prune_once(args.run_dir, args.when, args.verl_log)
        return 0
    parent = os.getppid()
    stop_file = args.stop_file
    poll(args.run_dir, args.interval,
         lambda: bool(stop_file and stop_file.exists()) or os.getppid() != parent, args.verl_log)
    return 0


if __name__ == "__main__":
    sys.exit(main())
