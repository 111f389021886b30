"""`hpc-grpo submit cluster=local --no-wait` under a pipe: submitit's local controller outlives the command and
would hold the reader's pipe open until the job ends (a captured `--no-wait` submit then waited for the whole run).
launch.submit.controller_stdio gives it /dev/null and a log of its own while it starts."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
STARTER = """
import subprocess, sys
from pathlib import Path
from hpc_grpo.launch.submit import controller_stdio
{wrap}
    child = subprocess.Popen(["sh", "-c", "echo controller speaks; exec sleep 60"])
Path({pid_file!r}).write_text(str(child.pid))
print("started", flush=True)
"""


def _start(tmp_path: Path, wrapped: bool) -> tuple[subprocess.Popen[str], float]:
    wrap = f"with controller_stdio(Path({str(tmp_path / 'c.log')!r})):" if wrapped else "if True:"
    began = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-c", STARTER.format(wrap=wrap, pid_file=str(tmp_path / "pid"))], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    return proc, began


def _stop(tmp_path: Path) -> None:
    os.kill(int((tmp_path / "pid").read_text()), signal.SIGKILL)


def test_a_detached_child_does_not_hold_the_callers_pipe(tmp_path: Path) -> None:
    proc, began = _start(tmp_path, wrapped=True)
    out, err = proc.communicate(timeout=30)  # EOF as soon as the starter exits, not when the child does
    took = time.monotonic() - began
    _stop(tmp_path)
    assert proc.returncode == 0, err
    assert took < 20, f"the pipe stayed open {took:.0f} s: the child holds it"
    assert "controller speaks" not in out
    assert "started" in out  # the starter's own stdout is back after the block
    deadline = time.monotonic() + 10
    while "controller speaks" not in (tmp_path / "c.log").read_text() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert "controller speaks" in (tmp_path / "c.log").read_text()


def test_control_without_it_the_pipe_stays_open(tmp_path: Path) -> None:
    """The control: the same child started without controller_stdio keeps the pipe open after the starter exits."""
    proc, _ = _start(tmp_path, wrapped=False)
    try:
        proc.communicate(timeout=5)
        raise AssertionError("the pipe closed although the child inherited it")
    except subprocess.TimeoutExpired:
        pass
    finally:
        _stop(tmp_path)
        proc.communicate(timeout=30)
