"""Run verl's driver with its output read line by line, and stop it when its rollout engine is gone for good.

Why: verl waits forever on a dead vLLM engine (hpc_grpo.engines.rollout_faults), so a worker killed by the OOM
killer costs the rest of the allocation. Every line still reaches the job's log unchanged (stdout to stdout, stderr
to stderr); a line that names an unrecoverable rollout failure starts a grace period, after which the driver is
stopped and the job fails with that line in its log. `hpc-grpo resume` then continues from the newest checkpoint.
The same loop stops the driver when the job's health watch asks (job/health_watch: `health.stop_on`).
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import IO

from hpc_grpo.engines.rollout_faults import GRACE_S, fatal_rollout_reason
from hpc_grpo.job.health_watch import HEALTH_STOPPED

# The status a job whose driver was stopped this way exits with (as a shell reports a SIGTERM'd child).
STOPPED_STATUS = 143


class _Fault:
    """The first fatal line seen, shared by the two reader threads."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.line: str | None = None
        self.reason: str | None = None
        self.seen_at = 0.0

    def record(self, line: str, reason: str) -> None:
        with self.lock:
            if self.line is None:
                self.line, self.reason, self.seen_at = line.strip(), reason, time.monotonic()


def _pump(src: IO[bytes], dst: IO[bytes], fault: _Fault) -> None:
    for raw in iter(src.readline, b""):
        dst.write(raw)
        dst.flush()
        line = raw.decode("utf-8", "replace")
        reason = fatal_rollout_reason(line)
        if reason is not None:
            fault.record(line, reason)
    src.close()


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def run_watched(argv: list[str], env: dict[str, str], log: Callable[[str], None], grace_s: float = GRACE_S,
                stop_when: Callable[[], str | None] | None = None) -> int:
    """The driver's exit status; STOPPED_STATUS when it was stopped after a fatal rollout line, HEALTH_STOPPED when
    `stop_when` gave a reason (job/health_watch: a finding the recipe stops on). On our own way out (a signal), the
    driver is stopped too, never left behind."""
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    fault = _Fault()
    pumps: list[threading.Thread] = []
    announced = False
    try:  # from the start of the pumps on: a signal that lands while they start must stop the driver too
        pumps = [threading.Thread(target=_pump, args=(src, dst, fault), daemon=True)
                 for src, dst in ((proc.stdout, sys.stdout.buffer), (proc.stderr, sys.stderr.buffer))]
        for t in pumps:
            t.start()
        while proc.poll() is None:
            time.sleep(0.5)
            why = stop_when() if stop_when is not None else None
            if why:
                _stop(proc)
                log(f"driver stopped: {why}")
                return HEALTH_STOPPED
            if fault.line is None:
                continue
            if not announced:
                log(f"rollout engine failure: {fault.reason}: {fault.line[-400:]}; verl may wait on it forever, "
                    f"so the driver is stopped in {grace_s:.0f} s unless it exits first")
                announced = True
            if time.monotonic() - fault.seen_at >= grace_s:
                _stop(proc)
                log(f"driver stopped after the rollout engine failure ({fault.reason}); "
                    "`hpc-grpo resume RUN` continues from the newest checkpoint")
                return STOPPED_STATUS
        return proc.returncode
    except BaseException:
        _stop(proc)
        raise
    finally:
        for t in pumps:
            if t.ident is not None:  # a signal during `start` leaves the later pumps unstarted: nothing to join
                t.join(timeout=5)
