"""The driver watch: a verl driver whose vLLM engine died is stopped (verl itself waits forever), every other
driver runs untouched and its output reaches the log unchanged. Real child processes, no stand-ins."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from hpc_grpo.engines.rollout_faults import fatal_rollout_reason
from hpc_grpo.common.procstat import ended
from hpc_grpo.job.driver_watch import STOPPED_STATUS, run_watched

# Lines as vLLM 0.32 prints them through Ray's log monitor (prefix included).
FATAL = [
    "\x1b[36m(vLLMHttpServer pid=7044)\x1b[0m (EngineCore pid=7383) ERROR 12-05 08:22:43 [multiproc_executor.py:316] "
    "Worker proc VllmWorker-0 died unexpectedly (exit code: -9), shutting down executor.",
    "(vLLMHttpServer pid=1) WARNING [core_client.py:817] [shutdown] MPClient: engine core exited unexpectedly; "
    "starting cleanup",
    "vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue. See stack trace (above) for the "
    "root cause.",
    "(EngineCore pid=7383) ERROR [core.py:1750] RuntimeError: Worker failed with error 'cannot close exported "
    "pointers exist', please check the stack trace above for the root cause",
]
HEALTHY = [
    "(TaskRunnerV1 pid=6374) step:3 - critic/score/mean:0.1 - actor/pg_loss:0.01",
    "(WorkerDict pid=1) WARNING: layered_summon returned empty, falling back to full summon",
    "(vLLMHttpServer pid=2) INFO: Engine 000: Avg prompt throughput: 10.0 tokens/s",
    "ValueError: worker died of boredom",  # an error, but not vLLM's word for a dead engine
]


@pytest.mark.parametrize("line", FATAL)
def test_fatal_lines_are_recognised(line: str) -> None:
    assert fatal_rollout_reason(line) is not None


@pytest.mark.parametrize("line", HEALTHY)
def test_healthy_lines_are_not(line: str) -> None:
    assert fatal_rollout_reason(line) is None


def _driver(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def test_a_hung_driver_after_a_fatal_line_is_stopped(capfd: pytest.CaptureFixture[str]) -> None:
    said: list[str] = []
    code = (f"import sys, time; print('step:1'); print({FATAL[0]!r}, file=sys.stderr, flush=True); "
            "sys.stdout.flush(); time.sleep(600)")
    t0 = time.monotonic()
    status = run_watched(_driver(code), env={}, log=said.append, grace_s=1.0)
    assert status == STOPPED_STATUS
    assert time.monotonic() - t0 < 30
    assert "a vLLM worker process died" in said[0] and "Worker proc VllmWorker-0 died" in said[0]
    assert "hpc-grpo resume" in said[1]
    out, err = capfd.readouterr()
    assert "step:1" in out and "died unexpectedly" in err  # each stream to its own log


def test_a_driver_that_exits_by_itself_keeps_its_status(capfd: pytest.CaptureFixture[str]) -> None:
    said: list[str] = []
    lines = "\n".join(HEALTHY)
    status = run_watched(_driver(f"import sys; print({lines!r}); sys.exit(3)"), env={}, log=said.append, grace_s=1)
    assert status == 3 and said == []
    assert capfd.readouterr().out == lines + "\n"


def test_a_driver_that_fails_by_itself_within_the_grace_keeps_its_status() -> None:
    said: list[str] = []
    code = f"import sys, time; print({FATAL[2]!r}, flush=True); time.sleep(1); sys.exit(1)"
    assert run_watched(_driver(code), env={}, log=said.append, grace_s=20) == 1
    assert len(said) == 1  # announced, never stopped


def test_the_driver_is_not_left_behind_when_the_watch_is_interrupted() -> None:
    code = "import os, time; print(os.getpid(), flush=True); time.sleep(600)"
    proc = subprocess.Popen(
        [sys.executable, "-c",
         "import signal, sys; from hpc_grpo.job.driver_watch import run_watched\n"
         "signal.signal(signal.SIGTERM, lambda *a: sys.exit(143))\n"
         f"run_watched([sys.executable, '-c', {code!r}], env={{}}, log=print)"],
        stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    child = int(proc.stdout.readline())
    proc.terminate()
    assert proc.wait(timeout=30) == 143
    # Gone, or a zombie its new parent (PID 1) has yet to reap: nothing of it runs. Polled, as a loaded machine
    # takes its time to deliver the kill.
    deadline = time.monotonic() + 15
    while not ended(child) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert ended(child), f"the driver {child} still runs after the watch was stopped"


def test_a_signal_while_the_pumps_start_stops_the_driver_and_propagates(monkeypatch: pytest.MonkeyPatch) -> None:
    """The race above, made certain: the signal's exception lands in the second pump's `start`. The watch must let
    it through (not a RuntimeError from joining a pump that never started) and stop the driver."""
    import threading

    from hpc_grpo.job import driver_watch

    starts: list[threading.Thread] = []

    class InterruptedOnSecondStart(threading.Thread):
        def start(self) -> None:
            starts.append(self)
            if len(starts) == 2:
                raise KeyboardInterrupt  # what the handler's SystemExit or Ctrl-C raises in the main thread
            super().start()

    monkeypatch.setattr(driver_watch.threading, "Thread", InterruptedOnSecondStart)
    spawned: list[subprocess.Popen[bytes]] = []
    real_popen = subprocess.Popen

    def popen(*args: object, **kwargs: object) -> subprocess.Popen[bytes]:
        spawned.append(real_popen(*args, **kwargs))  # type: ignore[call-overload]
        return spawned[-1]

    monkeypatch.setattr(driver_watch.subprocess, "Popen", popen)
    with pytest.raises(KeyboardInterrupt):
        run_watched([sys.executable, "-c", "import time; time.sleep(600)"], env={}, log=print)
    assert len(starts) == 2 and spawned[0].poll() is not None  # the driver was stopped, not left behind
