"""The scorer's reader of the sandbox runner's output (hpc_grpo/sandbox/code_sandbox.py, `main`).

The runner writes one line per test, then its summary:
    V <i> <payload>      a value (the sandbox's encoding, at most VALUE_CAP bytes, as the child sent it)
    O <i> <json>         any other outcome (["ok"], ["raised", "Name"], ...), a few bytes
    S <json>             the summary (status, seconds, isolation, ...), without the outcomes
A payload may carry whatever the completion forged, so every line is capped in bytes before it is parsed, and so
is the whole output; each outcome is handed to `on_outcome` as it arrives and dropped: the scorer holds one
value at a time, whatever the number of tests (each completion's cost must not grow with what it prints).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
from typing import Any
from collections.abc import Callable

VALUE_CAP = 1 << 20  # the runner's (code_sandbox.VALUE_CAP): bytes of one encoded value
LINE_CAP = VALUE_CAP + 4096
SUMMARY_CAP = 64 << 10


def _kill(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def read_report(proc: subprocess.Popen, job: bytes, n: int, timeout: float,
                on_outcome: Callable[[int, Any], Any] | None = None) -> dict[str, Any]:
    """Send the job, read the runner's lines (killing its process group after `timeout` s or at an oversize
    line or output); the summary with "outcomes": on_outcome(i, raw) per test (raw when None; None where the
    runner reported nothing)."""
    stdin, stdout, stderr = proc.stdin, proc.stdout, proc.stderr
    if stdin is None or stdout is None or stderr is None:
        raise TypeError("the runner must be started with stdin, stdout and stderr as pipes")
    timer = threading.Timer(timeout, _kill, (proc,))
    timer.start()
    outcomes: list[Any] = [None] * n
    summary: dict[str, Any] | None = None
    error = ""
    total, cap = 0, (n + 1) * (LINE_CAP + 64) + SUMMARY_CAP
    try:
        try:
            stdin.write(job)
            stdin.close()
        except BrokenPipeError:
            pass
        while True:
            line = stdout.readline(LINE_CAP)
            if not line:
                break
            total += len(line)
            if not line.endswith(b"\n") or total > cap:
                error = "the runner's output passed its size cap"
                _kill(proc)
                break
            kind, _, rest = line[:-1].partition(b" ")
            if kind == b"S" and len(line) <= SUMMARY_CAP:
                summary = json.loads(rest)
                continue
            index, _, body = rest.partition(b" ")
            i = int(index) if index.isdigit() and len(index) < 10 else -1
            if 0 <= i < n and kind in (b"V", b"O"):
                raw = ["value", body.decode("utf-8", "replace")] if kind == b"V" else json.loads(body)
                outcomes[i] = on_outcome(i, raw) if on_outcome else raw
        err = stderr.read(1 << 16)
        proc.wait()
    except ValueError as exc:  # a damaged line (the runner's own: never the code's, which cannot reach this pipe)
        _kill(proc)
        proc.wait()
        err, error = b"", f"unreadable runner output: {exc}"
    finally:
        timer.cancel()
        for pipe in (stdout, stderr):
            pipe.close()
    if summary is None or error:
        why = error or ("runner timed out" if proc.returncode == -signal.SIGKILL else "")
        return {"status": "sandbox_error", "outcomes": outcomes,
                "error": why or (err.decode(errors="replace")[-300:] or f"runner exit {proc.returncode}")}
    summary["outcomes"] = outcomes
    return summary
