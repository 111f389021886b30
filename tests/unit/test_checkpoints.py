"""checkpoints.py on trees in the pinned verl's and trl's real layouts, written with torch.save and
safetensors: complete ones, and each way a save goes wrong (torn shard, missing rank, empty or
missing tracker, writer killed with SIGKILL midway, truncated safetensors)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from hpc_grpo.runstate import checkpoints as ck
from hpc_grpo.runstate import layout
from tests import ckpt_trees as trees


def test_fsdp_complete_with_and_without_lora(tmp_path: Path) -> None:
    trees.verl_fsdp(tmp_path, 2, world=2)
    trees.verl_fsdp(tmp_path, 4, world=4, lora=True)
    found = ck.list_checkpoints(tmp_path, "verl")
    assert [(c.step, c.layout, c.complete) for c in found] == [(2, "verl-fsdp", True), (4, "verl-fsdp", True)]
    assert found[0].reason == "2 FSDP shards" and found[1].reason == "4 FSDP shards (LoRA)"
    files = [p for p in found[1].path.rglob("*") if p.is_file()]
    assert found[1].size_bytes == sum(p.stat().st_size for p in files) > 0
    assert found[1].mtime == pytest.approx(max(p.stat().st_mtime for p in found[1].path.rglob("*")))
    assert ck.newest_complete(found).step == 4
    assert ck.tracker_step(tmp_path) == 4


def test_megatron_v2_complete_and_broken(tmp_path: Path) -> None:
    trees.verl_megatron(tmp_path, 3)
    c = ck.list_checkpoints(tmp_path, "verl")[0]
    assert (c.layout, c.complete) == ("verl-megatron", True), c.reason
    # the manifest is written last: without it nothing else counts
    trees.verl_megatron(tmp_path, 6)
    (tmp_path / "checkpoints/global_step_6/actor/ckpt_contents.json").unlink()
    # a listed dist checkpoint without its .metadata is not finished
    trees.verl_megatron(tmp_path, 9)
    (tmp_path / "checkpoints/global_step_9/actor/optimizer/dist_ckpt/.metadata").unlink()
    # a torn HF weight file listed by the manifest
    trees.verl_megatron(tmp_path, 12)
    trees.truncate_half(tmp_path / "checkpoints/global_step_12/actor/model/huggingface/model.safetensors")
    found = {c.step: c for c in ck.list_checkpoints(tmp_path, "verl")}
    assert found[6].layout == "verl-megatron" and not found[6].complete and "ckpt_contents.json" in found[6].reason
    assert not found[9].complete and "optimizer/dist_ckpt has no .metadata" in found[9].reason
    assert not found[12].complete and "model.safetensors is truncated" in found[12].reason
    assert ck.newest_complete(list(found.values())).step == 3


def test_torn_shard_and_missing_rank(tmp_path: Path) -> None:
    trees.verl_fsdp(tmp_path, 1)
    trees.verl_fsdp(tmp_path, 2)
    trees.truncate_half(tmp_path / "checkpoints/global_step_2/actor/model_world_size_2_rank_1.pt")
    trees.verl_fsdp(tmp_path, 3, world=4)
    (tmp_path / "checkpoints/global_step_3/actor/optim_world_size_4_rank_3.pt").unlink()
    found = {c.step: c for c in ck.list_checkpoints(tmp_path, "verl")}
    assert found[1].complete
    assert not found[2].complete and found[2].reason.startswith("model shard rank 1 of 2: ")
    assert "truncated" in found[2].reason
    assert not found[3].complete and found[3].reason == "optim shard rank 3 of 4 is missing"
    assert ck.newest_complete(list(found.values())).step == 1


def test_data_pt_and_fsdp_config_are_required(tmp_path: Path) -> None:
    (trees.verl_fsdp(tmp_path, 1) / "data.pt").unlink()
    (trees.verl_fsdp(tmp_path, 2) / "actor" / "fsdp_config.json").unlink()
    found = {c.step: c for c in ck.list_checkpoints(tmp_path, "verl")}
    assert not found[1].complete and "data.pt is missing" in found[1].reason
    assert not found[2].complete and found[2].layout == "verl-fsdp" and "fsdp_config.json" in found[2].reason
    (tmp_path / "checkpoints/global_step_7").mkdir()
    assert [c.layout for c in ck.list_checkpoints(tmp_path, "verl")] == ["verl-fsdp", "verl-fsdp", "unknown"]


@pytest.mark.parametrize("content", ["", "\n", "garbage", None])
def test_empty_garbage_or_missing_tracker(tmp_path: Path, content: str | None) -> None:
    trees.verl_fsdp(tmp_path, 5, tracker=False)
    tracker = tmp_path / "checkpoints" / ck.TRACKER
    if content is not None:
        tracker.write_text(content)
    assert ck.tracker_step(tmp_path) is None
    assert ck.newest_complete(ck.list_checkpoints(tmp_path, "verl")).step == 5  # the folders still tell


def test_writer_killed_midway(tmp_path: Path) -> None:
    trees.verl_fsdp(tmp_path, 1)
    target = tmp_path / "checkpoints" / "global_step_2"
    proc = subprocess.Popen([sys.executable, "-c", trees.KILLED_WRITER, str(target)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "first shard written"
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    assert (target / "actor" / "fsdp_config.json").is_file()  # written first: not a marker
    found = {c.step: c for c in ck.list_checkpoints(tmp_path, "verl")}
    assert found[1].complete and not found[2].complete, found[2].reason
    assert ck.newest_complete(list(found.values())).step == 1


def test_trl_layout(tmp_path: Path) -> None:
    trees.trl_checkpoint(tmp_path, 2)
    trees.trl_checkpoint(tmp_path, 4)
    trees.truncate_half(tmp_path / "checkpoints/checkpoint-4/adapter_model.safetensors")
    trees.trl_checkpoint(tmp_path, 6)
    trees.truncate_half(tmp_path / "checkpoints/checkpoint-6/optimizer.pt")
    trees.trl_checkpoint(tmp_path, 8)
    (tmp_path / "checkpoints/checkpoint-8/trainer_state.json").write_text(json.dumps({"global_step": 7}))
    trees.trl_checkpoint(tmp_path, 10)
    (tmp_path / "checkpoints/checkpoint-10/rng_state.pth").unlink()
    found = {c.step: c for c in ck.list_checkpoints(tmp_path, "trl")}
    assert found[2].complete and found[2].layout == "trl", found[2].reason
    assert found[4].reason.startswith("adapter_model.safetensors is truncated")
    assert found[6].reason.startswith("optimizer.pt is truncated")
    assert found[8].reason == "trainer_state.json has global_step 7, expected 8"
    assert found[10].reason == "rng_state.pth is missing"
    assert ck.newest_complete(list(found.values())).step == 2
    assert ck.list_checkpoints(tmp_path, "verl") == []  # each engine sees only its own folder names


def test_file_is_whole_cut_anywhere(tmp_path: Path) -> None:
    pt = tmp_path / "x.pt"
    torch.save({"a": torch.arange(1000), "b": torch.ones(300)}, pt)
    st = tmp_path / "x.safetensors"
    trees.save_file({"a": torch.arange(1000.0)}, str(st))
    for f in (pt, st):
        whole = f.read_bytes()
        assert ck.file_is_whole(f)[0]
        for cut in (1, 9, len(whole) // 3, len(whole) // 2, len(whole) - 1):
            f.write_bytes(whole[:cut])
            ok, why = ck.file_is_whole(f)
            assert not ok and why.startswith(f.name), (f.name, cut, why)
        f.write_bytes(b"")
        assert ck.file_is_whole(f) == (False, f"{f.name} is empty")
    (tmp_path / "a.json").write_text('{"x": ')
    assert not ck.file_is_whole(tmp_path / "a.json")[0]
    assert ck.file_is_whole(tmp_path / "none.pt") == (False, "none.pt is missing")


def test_quarantine_moves_and_never_deletes(tmp_path: Path) -> None:
    trees.verl_fsdp(tmp_path, 1)
    bad = trees.verl_fsdp(tmp_path, 2)
    trees.truncate_half(bad / "actor" / "extra_state_world_size_2_rank_0.pt")
    before = trees.tree_snapshot(bad)
    keep = trees.tree_snapshot(tmp_path / "checkpoints" / "global_step_1")
    ckpt = ck.list_checkpoints(tmp_path, "verl")[1]
    moved = ck.quarantine(tmp_path, ckpt)
    assert moved.parent == tmp_path / layout.QUARANTINE_DIR and not bad.exists()
    assert trees.tree_snapshot(moved) == before
    assert trees.tree_snapshot(tmp_path / "checkpoints" / "global_step_1") == keep
    # same step torn again: a second, distinct name
    bad2 = trees.verl_fsdp(tmp_path, 2)
    moved2 = ck.quarantine(tmp_path, ck.judge(bad2, "verl"))
    assert moved2 != moved and moved.exists() and moved2.exists()
    from hpc_grpo.runstate.prune import quarantined

    assert [p for p, _, _ in quarantined(tmp_path)] == sorted([moved, moved2])  # what status and prune list


def test_symlinked_checkpoint_is_not_followed(tmp_path: Path) -> None:
    real = trees.verl_fsdp(tmp_path / "elsewhere", 3)
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "global_step_3").symlink_to(real)
    (c,) = ck.list_checkpoints(tmp_path, "verl")
    assert not c.complete and c.size_bytes == 0 and "symlink" in c.reason


def test_no_run_dir_and_bad_engine(tmp_path: Path) -> None:
    assert ck.list_checkpoints(tmp_path / "nothing", "trl") == []
    with pytest.raises(ValueError, match="engine"):
        ck.list_checkpoints(tmp_path, "deepspeed")


def test_module_imports_no_torch() -> None:
    code = "import sys, hpc_grpo.runstate.checkpoints; print(sorted(m for m in ('torch','safetensors','numpy') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_trl_sharded_weights_and_stray_names(tmp_path: Path) -> None:
    d = trees.trl_checkpoint(tmp_path, 2)
    (d / "adapter_model.safetensors").unlink()
    trees.save_file({"a": torch.ones(4)}, str(d / "model-00001-of-00002.safetensors"))
    (d / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}))
    assert ck.judge(d, "trl").reason == "model-00002-of-00002.safetensors is missing"
    trees.save_file({"b": torch.ones(4)}, str(d / "model-00002-of-00002.safetensors"))
    assert ck.judge(d, "trl").complete
    root = tmp_path / "checkpoints"
    for stray in ("checkpoint-x", "tmp-checkpoint-14", "global_step_3"):
        (root / stray).mkdir()
    (root / "README.md").write_text("not a checkpoint")
    assert [c.step for c in ck.list_checkpoints(tmp_path, "trl")] == [2]
