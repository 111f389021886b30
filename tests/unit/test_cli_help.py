"""The CLI's own answers before any command runs: `--version`, and `--help` lines that are whole sentences (click
cuts a long one with "..." at the terminal's width unless the command declares its short help)."""

from __future__ import annotations

import pytest

from hpc_grpo import __version__
from hpc_grpo.cli.console import short_help
from tests.cli_run import run_cli


def test_version_prints_the_package_version(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    code, text = run_cli(monkeypatch, capsys, "--version")
    assert code in (0, None)
    assert text.strip() == f"hpc-grpo {__version__}"


@pytest.mark.parametrize("argv", [["--help"], ["data", "--help"], ["model", "--help"]])
def test_help_lists_no_cut_description(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
                                       argv: list[str]) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    code, text = run_cli(monkeypatch, capsys, *argv)
    assert code in (0, None)
    commands = text.split("Commands:", 1)[1]
    assert "..." not in commands, commands
    assert max(len(line) for line in text.splitlines()) <= 80


def test_short_help_keeps_the_first_sentence_and_parentheses() -> None:
    assert short_help("Do a thing. Then more.\n\nDetails.") == "Do a thing."
    assert short_help("Merge (a: b), e.g. to start. More.") == "Merge (a: b), e.g. to start."
    long = "Rehearse a recipe: " + "x " * 70
    assert short_help(long) == "Rehearse a recipe."
