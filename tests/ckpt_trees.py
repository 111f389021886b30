"""Checkpoint trees in the engines' real on-disk layouts, written with the real torch.save and
safetensors (shared by the checkpoint, resume-preparation and prune tests).

The pinned verl's order is kept: each rank's model/optim/extra_state shard, rank 0's huggingface/ and
fsdp_config.json (not a completion marker), lora_train_meta.json for LoRA runs, then data.pt, then the
tracker. Megatron v2: model/, optimizer/, extra/ dist_ckpt folders, transformer_config.json, and
ckpt_contents.json last. trl: weights, optimizer, scheduler, rng, then trainer_state.json.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from safetensors.torch import save_file


def _tensor(seed: int, n: int = 64) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, generator=g)


def verl_fsdp(run_dir: Path, step: int, world: int = 2, lora: bool = False, tracker: bool = True) -> Path:
    actor = run_dir / "checkpoints" / f"global_step_{step}" / "actor"
    actor.mkdir(parents=True, exist_ok=True)
    for rank in range(world):
        weights = {"lora_A": _tensor(step * 10 + rank, 16)} if lora else {"w": _tensor(step * 10 + rank)}
        torch.save(weights, actor / f"model_world_size_{world}_rank_{rank}.pt")
        torch.save({"state": {0: {"exp_avg": _tensor(rank)}}, "param_groups": [{"lr": 1e-6}]},
                   actor / f"optim_world_size_{world}_rank_{rank}.pt")
        torch.save({"lr_scheduler": {"last_epoch": step}, "rng": torch.get_rng_state()},
                   actor / f"extra_state_world_size_{world}_rank_{rank}.pt")
    hf = actor / "huggingface"
    hf.mkdir(exist_ok=True)
    (hf / "config.json").write_text(json.dumps({"model_type": "qwen2", "hidden_size": 64}))
    (hf / "tokenizer_config.json").write_text("{}")
    (actor / "fsdp_config.json").write_text(json.dumps({"FSDP_version": 2, "world_size": world}, indent=4))
    if lora:
        (actor / "lora_train_meta.json").write_text(json.dumps({"r": 8, "lora_alpha": 16, "task_type": "CAUSAL_LM"}))
    torch.save({"dataloader_state": {"step": step}}, actor.parent / "data.pt")
    if tracker:
        (run_dir / "checkpoints" / "latest_checkpointed_iteration.txt").write_text(str(step))
    return actor.parent


def verl_megatron(run_dir: Path, step: int, world: int = 2, tracker: bool = True) -> Path:
    actor = run_dir / "checkpoints" / f"global_step_{step}" / "actor"
    for sub in ("model/dist_ckpt", "optimizer/dist_ckpt", "extra/dist_ckpt"):
        d = actor / sub
        d.mkdir(parents=True, exist_ok=True)
        for rank in range(world):
            torch.save({"shard": _tensor(step + rank)}, d / f"__{rank}_0.distcp")
        torch.save({"common": step}, d / "common.pt")
        (d / "metadata.json").write_text(json.dumps({"sharded_backend": "torch_dist"}))
        (d / ".metadata").write_bytes(b"\x80\x04metadata")
    hf = actor / "model" / "huggingface"
    hf.mkdir(parents=True, exist_ok=True)
    (hf / "config.json").write_text(json.dumps({"model_type": "qwen2"}))
    save_file({"w": _tensor(step)}, str(hf / "model.safetensors"))
    (actor / "transformer_config.json").write_text(json.dumps({"num_layers": 2}))
    contents = {
        "model": {"path": "model/dist_ckpt", "format": "megatron_dist_checkpoint", "backend": "dist_checkpointing"},
        "hf_model": {"path": "model/huggingface", "format": "huggingface"},
        "optimizer": {"path": "optimizer/dist_ckpt", "format": "megatron_dist_checkpoint"},
        "lr_scheduler": {"path": "optimizer/dist_ckpt", "format": "megatron_dist_checkpoint", "key": "lr_scheduler"},
        "rng_state": {"path": "extra/dist_ckpt", "format": "megatron_dist_checkpoint", "key": "rng_state"},
        "transformer_config": {"path": "transformer_config.json", "format": "json"},
    }
    manifest = {"schema_version": 2, "framework": "megatron", "role": "actor", "global_step": step,
                "world_size": world, "save_contents": ["model", "optimizer", "extra", "hf_model"],
                "contents": contents, "directories": {}, "saved_any_dist_ckpt": True}
    torch.save({"dataloader_state": {"step": step}}, actor.parent / "data.pt")
    tmp = actor / "ckpt_contents.json.tmp"
    tmp.write_text(json.dumps(manifest, indent=2, sort_keys=True))
    os.replace(tmp, actor / "ckpt_contents.json")
    if tracker:
        (run_dir / "checkpoints" / "latest_checkpointed_iteration.txt").write_text(str(step))
    return actor.parent


def trl_checkpoint(run_dir: Path, step: int) -> Path:
    d = run_dir / "checkpoints" / f"checkpoint-{step}"
    d.mkdir(parents=True, exist_ok=True)
    save_file({"base_model.model.lora_A.weight": _tensor(step, 32)}, str(d / "adapter_model.safetensors"))
    (d / "adapter_config.json").write_text(json.dumps({"r": 8}))
    torch.save({"state": {}, "param_groups": [{"lr": 1e-5}]}, d / "optimizer.pt")
    torch.save({"last_epoch": step}, d / "scheduler.pt")
    torch.save({"python": 1, "cpu": torch.get_rng_state()}, d / "rng_state.pth")
    (d / "trainer_state.json").write_text(json.dumps({"global_step": step, "max_steps": 100}))
    return d


def truncate_half(path: Path) -> None:
    """Cut a file to half its size: torn, but not empty."""
    size = path.stat().st_size
    with path.open("r+b") as fh:
        fh.truncate(size // 2)
    assert 0 < path.stat().st_size < size


def tree_snapshot(root: Path) -> dict[str, tuple[int, int]]:
    """Every file below root -> (size, mtime_ns): "nothing else moved" compares two of these."""
    out = {}
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            p = Path(dirpath) / name
            st = p.lstat()
            out[str(p.relative_to(root))] = (st.st_size, st.st_mtime_ns)
    return out


KILLED_WRITER = r"""
import json, sys, time
from pathlib import Path
import torch
actor = Path(sys.argv[1]) / "actor"
actor.mkdir(parents=True)
world = 2
(actor / "fsdp_config.json").write_text(json.dumps({"FSDP_version": 2, "world_size": world}))
torch.save({"w": torch.zeros(8)}, actor / f"model_world_size_{world}_rank_0.pt")
print("first shard written", flush=True)
big = torch.randn(4_000_000)
for rank in range(world):
    for kind in ("optim", "extra_state", "model"):
        torch.save({"big": big}, actor / f"{kind}_world_size_{world}_rank_{rank}.pt")
torch.save({"dataloader_state": {}}, actor.parent / "data.pt")
print("done", flush=True)
"""
