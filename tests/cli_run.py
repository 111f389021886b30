"""The CLI run in-process, as a user types it: its exit code and what it printed (stdout then stderr)."""

from __future__ import annotations

import sys
from typing import Any

import pytest

from hpc_grpo.cli import app as cli


def run_cli(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], *argv: str,
            stdout_only: bool = False) -> tuple[Any, str]:
    """The exit code as SystemExit carries it (None or an int). stdout_only: for --json, whose stdout must parse
    whatever stderr says."""
    monkeypatch.setattr(sys, "argv", ["hpc-grpo", *argv])
    with pytest.raises(SystemExit) as exc:
        cli.main()
    captured = capsys.readouterr()
    return exc.value.code, captured.out + ("" if stdout_only else captured.err)


def run_plan(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], *argv: str,
             stdout_only: bool = False) -> tuple[Any, str]:
    """`hpc-grpo plan ARGV...`."""
    return run_cli(monkeypatch, capsys, "plan", *argv, stdout_only=stdout_only)
