"""Checkpoint trees on disk in each engine's layout, whole or broken, for the prune tests and the benchmark."""

from __future__ import annotations

import io
import json
import os
import struct
import zipfile
from pathlib import Path

BROKEN = ("whole", "missing", "truncated")


def torch_file(path: Path, payload: int = 64) -> None:
    """A file torch.load would accept as far as structure goes: a zip with its end record."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as z:
        z.writestr("archive/data.pkl", b"x" * payload)
    path.write_bytes(buf.getvalue())


def safetensors_file(path: Path) -> None:
    header = json.dumps({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}).encode()
    path.write_bytes(struct.pack("<Q", len(header)) + header + b"\0" * 8)


def _break(path: Path, how: str) -> None:
    if how == "missing":
        path.unlink()
    elif how == "truncated":
        data = path.read_bytes()
        path.write_bytes(data[: len(data) // 2])


def trl_checkpoint(ckpt_dir: Path, step: int, how: str = "whole") -> Path:
    d = ckpt_dir / f"checkpoint-{step}"
    d.mkdir(parents=True)
    (d / "trainer_state.json").write_text(json.dumps({"global_step": step, "log_history": []}))
    safetensors_file(d / "adapter_model.safetensors")
    for name in ("optimizer.pt", "scheduler.pt", "rng_state.pth"):
        torch_file(d / name)
    if how != "whole":
        _break(d / "optimizer.pt", how)
    return d


def verl_fsdp_checkpoint(ckpt_dir: Path, step: int, how: str = "whole", world: int = 2, shards: int | None = None,
                         payload: int = 64) -> Path:
    d = ckpt_dir / f"global_step_{step}"
    actor = d / "actor"
    actor.mkdir(parents=True)
    (actor / "fsdp_config.json").write_text(json.dumps({"world_size": world}))
    for rank in range(world):
        for kind in ("model", "optim", "extra_state"):
            torch_file(actor / f"{kind}_world_size_{world}_rank_{rank}.pt", payload)
    for i in range(max(0, (shards or 0) - 3 * world)):  # extra shard files (huggingface/ config, tokenizer...)
        (actor / f"extra_{i}.bin").write_bytes(b"y" * payload)
    torch_file(d / "data.pt")
    if how != "whole":
        _break(actor / f"model_world_size_{world}_rank_{world - 1}.pt", how)
    return d


def verl_megatron_checkpoint(ckpt_dir: Path, step: int, how: str = "whole") -> Path:
    d = ckpt_dir / f"global_step_{step}"
    actor = d / "actor"
    (actor / "model" / "dist_ckpt").mkdir(parents=True)
    (actor / "model" / "dist_ckpt" / "shard_0.distcp").write_bytes(b"z" * 128)
    (actor / "transformer_config.json").write_text("{}")
    torch_file(d / "data.pt")
    if how == "whole":
        (actor / "ckpt_contents.json").write_text(json.dumps(["model", "transformer_config.json"]))
    elif how == "truncated":
        (actor / "ckpt_contents.json").write_text('["mod')
    return d


MAKERS = {"trl": trl_checkpoint, "verl-fsdp": verl_fsdp_checkpoint, "verl-megatron": verl_megatron_checkpoint}


def set_mtime(path: Path, when: float) -> None:
    """Every file below path (and path) gets mtime `when`, links untouched."""
    for root, dirs, files in os.walk(path):
        for name in files + dirs:
            os.utime(os.path.join(root, name), (when, when), follow_symlinks=False)
    os.utime(path, (when, when), follow_symlinks=False)


def snapshot(root: Path) -> dict[str, tuple[int, float, bytes]]:
    """Everything below root without following links: path -> (mode, mtime, content or link target)."""
    out = {}
    for dirpath, dirs, files in os.walk(root):
        for name in dirs + files:
            p = os.path.join(dirpath, name)
            st = os.lstat(p)
            if os.path.islink(p):
                body = os.readlink(p).encode()
            elif os.path.isfile(p):
                body = Path(p).read_bytes()
            else:
                body = b""
            out[os.path.relpath(p, root)] = (st.st_mode, st.st_mtime, body)
    return out
