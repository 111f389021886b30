"""Findings: the one currency of every pre-submit check.

Each check returns findings instead of raising, so `plan` can show all problems at once and
the caller decides (exit code 2 for invalid input, nonzero for any error finding).
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass
from enum import Enum
from pathlib import Path


class Severity(str, Enum):  # noqa: UP042 (StrEnum would change how str() and rich print it)
    ERROR = "error"
    WARNING = "warning"
    INFO = "info"


@dataclass(frozen=True, slots=True)
class Finding:
    """One problem or piece of advice, tied to the spec key it is about and the fix."""

    severity: Severity
    key: str
    message: str
    fix: str = ""
    # An estimate (memory), not a rule the engine enforces: its error may be accepted (`--accept KEY`); a rule's never.
    estimate: bool = False

    def as_dict(self) -> dict[str, str | bool]:
        d = asdict(self)
        d["severity"] = self.severity.value
        return d

    def __str__(self) -> str:
        fix = f" Fix: {self.fix}" if self.fix else ""
        return f"{self.severity.value}: {self.key}: {self.message}{fix}"


def error(key: str, message: str, fix: str = "") -> Finding:
    return Finding(Severity.ERROR, key, message, fix)


def estimate(severity: Severity, key: str, message: str, fix: str = "") -> Finding:
    """A finding from an estimate (not a rule): an error of this kind can be accepted explicitly."""
    return Finding(severity, key, message, fix, estimate=True)


def warning(key: str, message: str, fix: str = "") -> Finding:
    return Finding(Severity.WARNING, key, message, fix)


def info(key: str, message: str, fix: str = "") -> Finding:
    return Finding(Severity.INFO, key, message, fix)


# error() at submit, warning() in plan: the checks that depend on where they run take one of the two.
Make = Callable[[str, str, str], Finding]


def has_errors(findings: list[Finding]) -> bool:
    return any(f.severity is Severity.ERROR for f in findings)


def cannot_read(path: Path | str, exc: BaseException) -> str:
    """What a check says of a file it could not open or parse: the file and the reason, never a traceback."""
    errno_ = exc.errno if isinstance(exc, OSError) else None  # pyarrow's strerror is a paragraph; its errno is not
    if not errno_ and os.path.exists(path) and not os.access(path, os.R_OK):
        errno_ = errno.EACCES
    reason = os.strerror(errno_) if errno_ else str(exc) or type(exc).__name__
    return f"{path} cannot be read here ({reason})"


READ_FIX = ("make it readable to you (`ls -l` shows its owner and mode: `chmod a+r FILE`, or ask its owner) or point the "
            "key at a copy you can read")
