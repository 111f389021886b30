"""STAND-IN for branch i9resume's checkpoints.py (same interface, CHECKPOINTS_API.md); take i9resume's on merge.

It only wraps the engines' existing listers so the evaluation can be written against the final interface.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

QUARANTINE_DIR = "checkpoints-incomplete"


@dataclass(frozen=True, slots=True)
class Checkpoint:
    step: int
    path: Path
    layout: str
    complete: bool
    reason: str
    size_bytes: int
    mtime: float


def checkpoint_dir(run_dir: Path) -> Path:
    return Path(run_dir) / "checkpoints"


def _size_mtime(path: Path) -> tuple[int, float]:
    size, mtime = 0, 0.0
    for root, _dirs, files in os.walk(path):
        for name in files:
            st = os.lstat(os.path.join(root, name))
            if not os.path.islink(os.path.join(root, name)):
                size += st.st_size
            mtime = max(mtime, st.st_mtime)
    return size, mtime


def list_checkpoints(run_dir: Path, engine: str) -> list[Checkpoint]:
    out = []
    if engine == "trl":
        from hpc_grpo.engines.trl import list_checkpoints as trl_list

        for c in trl_list(checkpoint_dir(run_dir)):
            out.append(Checkpoint(c.step, c.path, "trl", c.complete, c.reason, *_size_mtime(c.path)))
    else:
        from hpc_grpo.engines.verl import list_checkpoints as verl_list

        for c in verl_list(checkpoint_dir(run_dir)):
            layout = "verl-megatron" if (c.path / "actor" / "ckpt_contents.json").is_file() else "verl-fsdp"
            out.append(Checkpoint(c.step, c.path, layout, c.complete, c.reason, *_size_mtime(c.path)))
    return sorted(out, key=lambda c: c.step)


def newest_complete(ckpts: list[Checkpoint]) -> Checkpoint | None:
    done = [c for c in ckpts if c.complete]
    return done[-1] if done else None
