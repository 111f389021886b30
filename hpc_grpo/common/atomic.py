"""Atomic file writes: the one helper every file hpc-grpo writes in place goes through (and its folder twin).

A temp file in the target's folder, then os.replace: a reader (another node, a poller, a killed job's successor)
sees the old file or the new one, never half of one. A folder (an export, the tiny model) is built in a temp folder
beside its target and renamed into place, so a folder that exists is whole. mkstemp makes its file 0600 and
os.replace keeps that mode, which would hide data files and run-dir state from the group sharing them: the file
gets the mode a plain open() would give it, 0666 less the umask.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any


def umask_mode(mode: int = 0o666) -> int:
    """`mode` less the process umask (read by setting it back at once: there is no getter)."""
    umask = os.umask(0)
    os.umask(umask)
    return mode & ~umask


def atomic_write(target: Path, write: Callable[[Path], object]) -> None:
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


def write_json_atomic(path: Path, data: Any) -> None:
    """JSON, indented and with sorted keys (results and markers people read), written atomically."""
    write_text_atomic(path, json.dumps(data, indent=2, sort_keys=True) + "\n")


def build_dir_atomic(target: Path, build: Callable[[Path], object], whole: Callable[[Path], bool]) -> bool:
    """Build a folder and rename it to `target`, so a folder at `target` is always a whole one.

    `build(path)` creates the folder at a path that does not exist yet, in a private temp folder beside `target`
    (same filesystem: the rename is atomic). When another process renamed its own build into place first and
    `whole(target)` says that one is whole, it is kept and this build dropped: returns False. The temp folder is
    removed in every case, also when `build` raises.
    """
    target = Path(target)
    work = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    try:
        built = work / target.name
        build(built)
        try:
            os.rename(built, target)
        except OSError:
            if not whole(target):
                raise
            return False
        return True
    finally:
        shutil.rmtree(work, ignore_errors=True)
