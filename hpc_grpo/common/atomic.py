"""Atomic file writes: the one helper every file hpc-grpo writes in place goes through.

A temp file in the target's folder, then os.replace: a reader (another node, a poller, a killed job's successor)
sees the old file or the new one, never half of one. mkstemp makes its file 0600 and os.replace keeps that mode,
which would hide data files and run-dir state from the group sharing them: the file gets the mode a plain open()
would give it, 0666 less the umask.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path


def umask_mode(mode: int = 0o666) -> int:
    """`mode` less the process umask (read by setting it back at once: there is no getter)."""
    umask = os.umask(0)
    os.umask(umask)
    return mode & ~umask


def atomic_write(target: Path, write: Callable[[Path], None]) -> None:
    """Call write(temp path) for a temp file beside target, then move it over target with the umask's mode."""
    target = Path(target)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    os.close(fd)
    try:
        write(Path(tmp))
        os.chmod(tmp, umask_mode())
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_text_atomic(path: Path, text: str) -> None:
    """Write text (UTF-8) atomically, synced to disk before the rename so a crash leaves the old file or the new."""

    def write(tmp: Path) -> None:
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())

    atomic_write(path, write)
