"""Resume preparation on checkpoint trees in the pinned verl's real layouts (written with torch.save): the
prepared resume points at the newest complete checkpoint, the verl arguments the launch script passes say
so (composed with verl's own Hydra config), the broken one ends in quarantine, and nothing else moves."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from hpc_grpo.runstate import checkpoints as ck
from hpc_grpo.runstate import runs
from hpc_grpo.engines.verl import VerlEngine, resume_overrides
from hpc_grpo.engines.verl_schema import verl_config_dir
from hpc_grpo.job import prepare_resume as pr
from hpc_grpo.launch.render import render_all, write_files
from hpc_grpo.config.resolve import resolve_spec
from hpc_grpo.runstate.layout import QUARANTINE_DIR, state_files
from tests import ckpt_trees as trees


def torn_shard(run: Path) -> None:
    trees.truncate_half(trees.verl_fsdp(run, 6) / "actor" / "model_world_size_2_rank_1.pt")


def missing_rank(run: Path) -> None:
    (trees.verl_fsdp(run, 6, world=4) / "actor" / "extra_state_world_size_4_rank_2.pt").unlink()


def empty_tracker(run: Path) -> None:
    trees.verl_fsdp(run, 6, tracker=False)
    (trees.verl_fsdp(run, 6) / "data.pt").unlink()
    (run / "checkpoints" / ck.TRACKER).write_text("")  # verl's open("w") cut by the kill


def missing_tracker(run: Path) -> None:
    (trees.verl_fsdp(run, 6) / "data.pt").unlink()
    (run / "checkpoints" / ck.TRACKER).unlink()


def killed_writer(run: Path) -> None:
    proc = subprocess.Popen([sys.executable, "-c", trees.KILLED_WRITER, str(run / "checkpoints" / "global_step_6")],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "first shard written"
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL


def megatron_no_manifest(run: Path) -> None:
    (trees.verl_megatron(run, 6) / "actor" / "ckpt_contents.json").unlink()


FAULTS = {"torn-shard": torn_shard, "missing-rank": missing_rank, "empty-tracker": empty_tracker,
          "missing-tracker": missing_tracker, "killed-writer": killed_writer}
LAYOUTS = {"fsdp": lambda run, s: trees.verl_fsdp(run, s), "fsdp-lora": lambda run, s: trees.verl_fsdp(run, s, lora=True),
           "megatron": lambda run, s: trees.verl_megatron(run, s)}


@pytest.mark.parametrize("fault", sorted(FAULTS))
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_prepared_resume_points_at_newest_complete(tmp_path: Path, layout: str, fault: str) -> None:
    run = tmp_path / "run"
    LAYOUTS[layout](run, 2)
    LAYOUTS[layout](run, 4)
    FAULTS[fault](run)
    good = {s: trees.tree_snapshot(run / "checkpoints" / f"global_step_{s}") for s in (2, 4)}
    broken = trees.tree_snapshot(run / "checkpoints" / "global_step_6")

    prepared = pr.prepare(run, "verl")

    assert prepared.checkpoint is not None and prepared.step == 4
    assert prepared.checkpoint.path == run / "checkpoints" / "global_step_4"
    assert prepared.overrides == ["trainer.resume_mode=resume_path",
                                  f"trainer.resume_from_path={run / 'checkpoints' / 'global_step_4'}"]
    (old, new, why), = prepared.quarantined
    assert old == str(run / "checkpoints" / "global_step_6") and why
    assert Path(new).parent == run / QUARANTINE_DIR and trees.tree_snapshot(Path(new)) == broken
    # nothing else moved: the complete ones are byte- and time-identical, and nothing else is in checkpoints/
    assert {s: trees.tree_snapshot(run / "checkpoints" / f"global_step_{s}") for s in (2, 4)} == good
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["global_step_2", "global_step_4", ck.TRACKER]
    # the pinned verl reads the tracker even with resume_path (int('') raises): it now names the chosen step
    assert ck.tracker_step(run) == 4


def test_megatron_without_manifest_is_quarantined(tmp_path: Path) -> None:
    trees.verl_megatron(tmp_path, 3)
    megatron_no_manifest(tmp_path)
    prepared = pr.prepare(tmp_path, "verl")
    assert prepared.step == 3 and "ckpt_contents.json" in prepared.quarantined[0][2]


def test_nothing_complete_disables_resume(tmp_path: Path) -> None:
    torn_shard(tmp_path)
    (tmp_path / "checkpoints" / ck.TRACKER).write_text("")
    prepared = pr.prepare(tmp_path, "verl")
    assert prepared.checkpoint is None and prepared.overrides == ["trainer.resume_mode=disable"]
    assert len(prepared.quarantined) == 1 and prepared.tracker_before is None
    assert not any(o.endswith("=auto") for o in prepared.overrides)
    fresh = pr.prepare(tmp_path / "new-run", "verl")
    assert fresh.checkpoint is None and fresh.overrides == ["trainer.resume_mode=disable"] and not fresh.quarantined


def test_older_incomplete_ones_stay(tmp_path: Path) -> None:
    """Only NEWER broken checkpoints are in a resume's way; older ones are prune's business."""
    trees.truncate_half(trees.verl_fsdp(tmp_path, 2) / "data.pt")
    trees.verl_fsdp(tmp_path, 4)
    prepared = pr.prepare(tmp_path, "verl")
    assert prepared.step == 4 and not prepared.quarantined
    assert prepared.left == [(str(tmp_path / "checkpoints" / "global_step_2"), prepared.left[0][1])]
    assert (tmp_path / "checkpoints" / "global_step_2").is_dir() and not (tmp_path / QUARANTINE_DIR).exists()


def test_history_records_the_start(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    monkeypatch.setenv("SLURM_RESTART_COUNT", "2")
    trees.verl_fsdp(tmp_path, 2)
    torn_shard(tmp_path)
    pr.prepare_and_record(tmp_path, "verl")
    (entry,) = runs.read_history(tmp_path)
    assert (entry.job_id, entry.purpose, entry.executor) == ("4242", "start", "slurm")
    assert entry.note.startswith("resumes from global_step_2 (step 2); moved incomplete global_step_6 (model shard")
    assert entry.data["step"] == 2 and entry.data["restart_count"] == 2
    assert entry.data["quarantined"][0]["from"].endswith("global_step_6")
    assert entry.data["tracker_before"] == "6"
    assert runs.job_ids(tmp_path) == []  # an event of a job, not a submission


def test_launch_script_passes_the_prepared_overrides(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The rendered launch.sh's arguments to hpc_grpo.job.verl_node make node 0 run the preparation and append what
    it decided to the driver; verl's Hydra config, composed with the engine's overrides plus those, resumes from the
    chosen folder."""
    from hpc_grpo.job import node_plan, verl_node
    from tests.launch_script import node_argv

    spec = resolve_spec("qwen2.5-3b-gsm8k-lora", "a100-ib", overrides=[f"cluster.runs_root={tmp_path}"], run_name="r")
    write_files(spec.path, render_all(spec))
    trees.verl_fsdp(spec.path, 7, world=4, lora=True)  # the recipe's 1 node x 4 GPUs: loadable
    torn_shard(spec.path)
    launch = (spec.path / "scripts" / "launch.sh").read_text()
    assert "resume_mode=auto" not in launch and "resume_mode" not in " ".join(VerlEngine().command(spec).argv)
    opts = verl_node.parse_args(node_argv(launch, tmp_path))
    assert opts.resume and opts.spec == spec.path / "spec.yaml"
    assert opts.driver == VerlEngine().command(spec).argv
    monkeypatch.setenv("SLURM_JOB_ID", "99")
    files = state_files(opts.ray_dir, "99", 0)
    resume = pr.prepare_for_job(opts.spec, files.resume_args)
    assert resume is not None
    argv = node_plan.driver_argv(opts.driver, resume, opts.resume)
    args = argv[-2:]
    step7 = spec.path / "checkpoints" / "global_step_7"
    assert args == ["trainer.resume_mode=resume_path", f"trainer.resume_from_path={step7}"]
    assert files.resume_args.read_text().splitlines() == args  # for a custom driver to read
    (entry,) = runs.read_history(spec.path)
    assert entry.purpose == "start" and entry.note.startswith("resumes from global_step_7 (step 7)")

    config_dir = verl_config_dir()
    if config_dir is None:
        pytest.skip("verl's config files are not installed (pip install -e .[verl-schema]): compose not checked")
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(config_dir), version_base=None):
        cfg = compose(config_name=VerlEngine().command(spec).config_name,
                      overrides=VerlEngine().command(spec).overrides + args)
    assert cfg.trainer.resume_mode == "resume_path" and cfg.trainer.resume_from_path == str(step7)
    assert cfg.ray_kwargs.ray_init.runtime_env.env_vars.WANDB_RUN_ID == runs.wandb_run_id(spec.path)


def test_resume_keys_are_not_passthrough(tmp_path: Path) -> None:
    spec = resolve_spec("qwen2.5-3b-gsm8k-lora", "a100-ib", run_name="r",
                        overrides=[f"cluster.runs_root={tmp_path}", "passthrough.trainer.resume_mode=auto"])
    (finding,) = [f for f in VerlEngine().check(spec) if f.key == "passthrough.trainer.resume_mode"]
    assert "resume preparation" in finding.message or "resume preparation" in finding.hint
    with pytest.raises(ValueError, match="global_step_N"):
        resume_overrides(tmp_path / "checkpoint-3")


def test_checkpoint_lock_serialises(tmp_path: Path) -> None:
    order: list[str] = []

    def other() -> None:
        with runs.checkpoint_lock(tmp_path):
            order.append("other")

    with runs.checkpoint_lock(tmp_path):
        t = threading.Thread(target=other)
        t.start()
        time.sleep(0.3)
        order.append("first")
    t.join(timeout=10)
    assert order == ["first", "other"]
    # another process holding it: a bounded wait that names the holder
    holder = subprocess.Popen([sys.executable, "-c", (
        "import sys, time; from pathlib import Path; from hpc_grpo.runstate import runs\n"
        f"with runs.checkpoint_lock(Path({str(tmp_path)!r})):\n    print('held', flush=True); time.sleep(30)")],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(TimeoutError, match="pid"):
            with runs.checkpoint_lock(tmp_path, timeout_s=0.3):
                pass
    finally:
        holder.kill()
        holder.wait()
    with runs.checkpoint_lock(tmp_path, timeout_s=5):  # a killed holder leaves nothing stuck
        pass


def test_wandb_run_id_is_per_run_directory(tmp_path: Path) -> None:
    a, b = runs.wandb_run_id(tmp_path / "x" / "run.1"), runs.wandb_run_id(tmp_path / "y" / "run.1")
    assert a != b and a == runs.wandb_run_id(tmp_path / "x" / "run.1")
    assert a.startswith("run_1-") and all(c.isalnum() or c in "_-" for c in a)
    spec = resolve_spec("qwen2.5-3b-gsm8k-lora", "a100-ib", overrides=[f"cluster.runs_root={tmp_path}"], run_name="w")
    cmd = VerlEngine().command(spec)
    rid = runs.wandb_run_id(spec.path)
    assert f"+ray_kwargs.ray_init.runtime_env.env_vars.WANDB_RUN_ID={rid}" in cmd.overrides
    assert "+ray_kwargs.ray_init.runtime_env.env_vars.WANDB_RESUME=allow" in cmd.overrides
    assert cmd.env == {"WANDB_RUN_ID": rid, "WANDB_RESUME": "allow"}
    json.dumps(cmd.env)
