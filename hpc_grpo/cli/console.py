"""Where the CLI prints: stdout and stderr consoles, tables, JSON, and the findings and row lists several commands
share. rich is loaded on the first print only (it costs ~50 ms), so `--json` and errors stay fast."""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Sequence
from typing import Any

from hpc_grpo.common.findings import Finding, Severity


class _LazyConsole:
    """rich costs ~50 ms to import: load it on first print, so `--json` and errors stay fast."""

    def __init__(self, stderr: bool) -> None:
        self._stderr = stderr
        self._console: Any = None

    def __getattr__(self, name: str) -> Any:
        if self._console is None:
            from rich.console import Console

            self._console = Console(stderr=self._stderr, highlight=False, soft_wrap=True)
        return getattr(self._console, name)


def Table(*args: Any, **kwargs: Any) -> Any:  # noqa: N802 - stands in for rich.table.Table
    from rich.table import Table as RichTable

    return RichTable(*args, **kwargs)


def print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2) + "\n")


out: Any = _LazyConsole(stderr=False)
err: Any = _LazyConsole(stderr=True)

def print_error(message: object) -> None:
    """`error: MESSAGE` on stderr; the message is text, never markup (it may quote a list such as [a,b])."""
    from rich.markup import escape

    err.print(f"[bold red]error:[/] {escape(str(message))}")


_STYLE = {Severity.ERROR: "bold red", Severity.WARNING: "yellow", Severity.INFO: "dim"}


def print_findings(findings: list[Finding], console: Any = out) -> None:
    """A table on a terminal; one whole line per finding in pipes and CI logs (a table would fold key
    names at 80 columns there, and grep could no longer find them)."""
    if not findings:
        console.print("No findings.")
        return
    order = {Severity.ERROR: 0, Severity.WARNING: 1, Severity.INFO: 2}
    ordered = sorted(findings, key=lambda f: order[f.severity])
    if not console.is_terminal:
        console.file.write("Findings:\n" + "".join(f"  {f}\n" for f in ordered))
        console.file.flush()
        return
    from rich.markup import escape  # messages quote lists and Hydra values: [a,b] is not markup

    t = Table(title="Findings", show_lines=False)
    for col in ("severity", "key", "message", "fix"):
        t.add_column(col, overflow="fold")
    for f in ordered:
        t.add_row(f"[{_STYLE[f.severity]}]{f.severity.value}[/]", escape(f.key), escape(f.message), escape(f.fix))
    console.print(t)


def print_rows(title: str, cols: tuple[str, ...], rows: Sequence[Sequence[str]]) -> None:
    """A table on a terminal; whole lines in pipes and CI logs, where a table folds paths and keys at 80 columns."""
    if not out.is_terminal:
        out.file.write(f"{title}:\n" + "".join("  " + "  |  ".join(r) + "\n" for r in rows))
        out.file.flush()
        return
    from rich.markup import escape

    t = Table(title=title)
    for col in cols:
        t.add_column(col, overflow="fold")
    for r in rows:
        t.add_row(*(escape(x) for x in r))
    out.print(t)


def print_table(title: str, cols: tuple[str, ...], rows: list[tuple[str, ...]], **column: Any) -> None:
    """A rich table of `rows` under `title`, every column made with the same `column` options."""
    t = Table(title=title)
    for col in cols:
        t.add_column(col, **column)
    for r in rows:
        t.add_row(*r)
    out.print(t)


def short_help(doc: str | None) -> str:
    """The line `--help` lists for a command: its docstring's first sentence, whole (click would cut it with
    "..." at the terminal's width), or the part before its first colon outside parentheses when the sentence is
    longer than two lines."""
    first = " ".join((doc or "").strip().split("\n\n")[0].split())
    sentence = re.split(r"\.\s+(?=[A-Z])", first)[0].rstrip(".")
    if len(sentence) > 120:
        depth = 0
        for i, ch in enumerate(sentence):
            depth += (ch == "(") - (ch == ")")
            if depth == 0 and sentence.startswith(": ", i):
                return sentence[:i] + "."
    return sentence + "."


def print_reward_note(note: str) -> None:
    """The recipe's one line on what its reward means (health.reward_note), so a demo's 0.1 and 0% read as
    expected, not broken."""
    if note:
        from rich.markup import escape

        out.print(f"[cyan]what the reward means:[/] {escape(note)}")
