"""The trainer's side of save-on-signal (hpc_grpo.job.save_signal; its files: hpc_grpo.runstate.save_request): the
request file of this attempt only, USR2 as a flag instead of death, SIGTERM held off only while a save is pending.
Real signals, in a child process."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
from pathlib import Path

from hpc_grpo.job import save_signal
from hpc_grpo.runstate import save_request


def test_request_file_counts_for_its_attempt_only(tmp_path: Path) -> None:
    state = save_signal.SaveOnSignal(tmp_path, attempt="41.0.100")
    assert not state.requested
    save_request.write_request(tmp_path, "41.0.99")  # an earlier attempt's request
    assert not state.requested
    save_request.write_request(tmp_path, "41.0.100")
    assert state.requested and state.requested_at is not None
    assert save_request.read_request(tmp_path)["attempt"] == "41.0.100"


def test_marker_records_the_saved_step(tmp_path: Path) -> None:
    state = save_signal.SaveOnSignal(tmp_path, attempt="x")
    state.write_marker(tmp_path, 7, str(tmp_path / "checkpoint-7"))
    marker = save_request.read_marker(tmp_path)
    assert marker["step"] == 7 and marker["checkpoint"].endswith("checkpoint-7") and state.saved_step == 7


CHILD = textwrap.dedent("""
    import os, signal, sys, time
    from hpc_grpo.job.save_signal import SaveOnSignal
    s = SaveOnSignal(None, attempt="")
    s.install()
    os.kill(os.getpid(), signal.SIGUSR2)          # a flag, not death
    time.sleep(0.1)
    print("requested", s.requested, flush=True)
    os.kill(os.getpid(), signal.SIGTERM)          # held: the save is pending
    time.sleep(0.1)
    print("held", s.held_sigterm, flush=True)
    s.saved_step = 3                               # saved: SIGTERM ends the process as before
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(5)
    print("still alive", flush=True)
""")


def test_usr2_is_a_flag_and_sigterm_waits_for_the_save() -> None:
    proc = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=60)
    assert "requested True" in proc.stdout and "held 1" in proc.stdout, proc.stdout + proc.stderr
    assert "still alive" not in proc.stdout
    assert proc.returncode == -signal.SIGTERM
