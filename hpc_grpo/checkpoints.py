"""Checkpoint layouts on disk (verl FSDP, verl Megatron, trl): the one module that parses checkpoint folders.

STAND-IN written by branch i10prune against the interface of /tmp/notes/CHECKPOINTS_API.md, so prune can be
built and tested before branch i9resume lands its module. On merge, i9resume's version wins; prune also uses
the two extras at the end (`candidates`, `inspect`), which read one checkpoint at a time.
No torch import: torch files are judged by their zip end record, safetensors by header against size.
"""

from __future__ import annotations

import json
import os
import re
import struct
import time
from dataclasses import dataclass
from pathlib import Path

QUARANTINE_DIR = "checkpoints-incomplete"
TRACKER = "latest_checkpointed_iteration.txt"
_NAME = {"verl": re.compile(r"^global_step_(\d+)\Z"), "trl": re.compile(r"^checkpoint-(\d+)\Z")}
_ZIP_END = b"PK\x05\x06"


@dataclass(frozen=True, slots=True)
class Checkpoint:
    step: int
    path: Path
    layout: str  # "verl-fsdp" | "verl-megatron" | "trl" | "unknown"
    complete: bool
    reason: str
    size_bytes: int
    mtime: float


def checkpoint_dir(run_dir: Path) -> Path:
    return Path(run_dir) / "checkpoints"


def file_is_whole(path: Path) -> tuple[bool, str]:
    """A torch zip has its end record, a safetensors file the bytes its header describes, a json file parses."""
    path = Path(path)
    try:
        if path.is_symlink() or not path.is_file():
            return False, f"{path.name} is missing"
        size = path.stat().st_size
        if size == 0:
            return False, f"{path.name} is empty"
        with path.open("rb") as fh:
            if path.suffix in (".pt", ".pth", ".bin"):
                fh.seek(max(0, size - 65_557))
                if _ZIP_END not in fh.read():
                    return False, f"{path.name} is truncated (no zip end record)"
            elif path.suffix == ".safetensors":
                raw = fh.read(8)
                (n,) = struct.unpack("<Q", raw) if len(raw) == 8 else (size,)
                if n > size - 8:
                    return False, f"{path.name} is truncated (header)"
                header = json.loads(fh.read(n))
                end = max((v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"), default=0)
                if 8 + n + end != size:
                    return False, f"{path.name} is truncated"
            elif path.suffix == ".json":
                json.loads(fh.read())
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return False, f"{path.name} is unreadable ({exc})"
    return True, "whole"


def _footprint(path: Path) -> tuple[int, float]:
    """Bytes of regular files below path and their newest mtime; symlinks are neither followed nor counted."""
    size, newest = 0, 0.0
    stack = [str(path)]
    while stack:
        try:
            with os.scandir(stack.pop()) as it:
                for e in it:
                    if e.is_dir(follow_symlinks=False):
                        stack.append(e.path)
                    elif e.is_file(follow_symlinks=False):
                        st = e.stat(follow_symlinks=False)
                        size += st.st_size
                        newest = max(newest, st.st_mtime)
        except OSError:
            continue
    if not newest:
        try:
            newest = path.lstat().st_mtime
        except OSError:
            newest = time.time()
    return size, newest


def _verl(path: Path) -> tuple[str, bool, str]:
    actor = path / "actor"
    manifest = actor / "ckpt_contents.json"
    if manifest.exists() or (actor / "transformer_config.json").exists():
        ok, why = file_is_whole(manifest)
        if not ok:
            return "verl-megatron", False, f"actor/{why}"
        try:
            listed = json.loads(manifest.read_text())
            names = listed if isinstance(listed, list) else listed.get("contents", [])
        except (OSError, ValueError, AttributeError):
            names = []
        for name in names:
            if isinstance(name, str) and not (actor / name).exists():
                return "verl-megatron", False, f"actor/{name} listed in ckpt_contents.json is missing"
        ok, why = file_is_whole(path / "data.pt")
        return ("verl-megatron", True, "megatron manifest and data.pt") if ok else ("verl-megatron", False, why)
    cfg = actor / "fsdp_config.json"
    try:
        world = int(json.loads(cfg.read_text())["world_size"])
    except (OSError, ValueError, KeyError, TypeError):
        return "unknown", False, "no readable actor/fsdp_config.json or ckpt_contents.json"
    for rank in range(world):
        for kind in ("model", "optim", "extra_state"):
            ok, why = file_is_whole(actor / f"{kind}_world_size_{world}_rank_{rank}.pt")
            if not ok:
                return "verl-fsdp", False, f"{kind} shard rank {rank}: {why}"
    ok, why = file_is_whole(path / "data.pt")
    return ("verl-fsdp", True, f"{world} FSDP shards") if ok else ("verl-fsdp", False, why)


def _trl(path: Path, step: int) -> tuple[str, bool, str]:
    state = path / "trainer_state.json"
    try:
        global_step = json.loads(state.read_text()).get("global_step")
    except (OSError, ValueError, AttributeError):
        return "trl", False, "trainer_state.json missing or unreadable"
    if global_step != step:
        return "trl", False, f"trainer_state.json has global_step {global_step}, expected {step}"
    weights = [path / n for n in ("adapter_model.safetensors", "model.safetensors") if (path / n).exists()]
    if not weights:
        return "trl", False, "no adapter_model.safetensors or model.safetensors"
    for f in [weights[0], path / "optimizer.pt", path / "scheduler.pt", *sorted(path.glob("rng_state*.pth"))]:
        ok, why = file_is_whole(f)
        if not ok:
            return "trl", False, why
    if not any(path.glob("rng_state*.pth")):
        return "trl", False, "rng_state.pth is missing"
    return "trl", True, "complete"


def candidates(run_dir: Path, engine: str) -> list[tuple[int, Path]]:
    """(step, folder) of every checkpoint-named entry, oldest first, nothing opened (cheap)."""
    folder = checkpoint_dir(run_dir)
    pattern = _NAME[engine]
    found = []
    try:
        with os.scandir(folder) as it:
            for e in it:
                m = pattern.match(e.name)
                if m:
                    found.append((int(m.group(1)), Path(e.path)))
    except OSError:
        return []
    return sorted(found)


def inspect(path: Path, engine: str) -> Checkpoint:
    """One checkpoint, judged in full. A symlink or non-folder is never complete."""
    path = Path(path)
    m = _NAME[engine].match(path.name)
    step = int(m.group(1)) if m else -1
    if path.is_symlink() or not path.is_dir():
        size, mtime = 0, path.lstat().st_mtime if os.path.lexists(path) else time.time()
        return Checkpoint(step, path, "unknown", False, "not a real folder (a symlink or a file)", size, mtime)
    layout, ok, reason = _verl(path) if engine == "verl" else _trl(path, step)
    size, mtime = _footprint(path)
    return Checkpoint(step, path, layout, ok, reason, size, mtime)


def list_checkpoints(run_dir: Path, engine: str) -> list[Checkpoint]:
    return [inspect(p, engine) for _, p in candidates(run_dir, engine)]


def newest_complete(ckpts: list[Checkpoint]) -> Checkpoint | None:
    done = [c for c in ckpts if c.complete]
    return max(done, key=lambda c: c.step) if done else None


def tracker_step(run_dir: Path) -> int | None:
    try:
        text = (checkpoint_dir(run_dir) / TRACKER).read_text().strip()
        return int(text) if text.isdigit() else None
    except (OSError, ValueError):
        return None
