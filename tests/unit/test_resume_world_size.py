"""Resume onto another GPU count: the pinned verl loads FSDP shards (actor/model_world_size_W_rank_R.pt) only at the
world size W that wrote them (verl issue #2265), so `hpc-grpo resume RUN resources.nodes=2` of a 1x4-GPU FSDP run
must be refused before anything is queued or written, with both fixes spelled out; the job's resume preparation
refuses it again (a "failed" line in the history). Megatron dist checkpoints reshard and trl saves whole weights:
no refusal. `hpc-grpo export RUN` is the export the message offers; verl's merger is stood in for by a script on
HPC_GRPO_VERL_PYTHON (the real merger runs in test_export_verl_merger.py)."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from hpc_grpo.evaluation import export
from hpc_grpo.runstate import runs
from hpc_grpo.commands import status
from hpc_grpo.job import prepare_resume as pr
from hpc_grpo.launch.render import render_all, write_files
from hpc_grpo.config.resolve import load_frozen, resolve_spec
from hpc_grpo.commands.resume import plan_resume
from hpc_grpo.planning.world_size import WorldSizeMismatch
from hpc_grpo.runstate import layout
from tests import ckpt_trees as trees

FSDP_RECIPE = "qwen2.5-3b-gsm8k-lora"  # verl FSDP, 1 node x 4 GPUs


def make_run(root: Path, recipe: str, cluster: str = "a100-ib", extra: tuple[str, ...] = ()) -> Path:
    spec = resolve_spec(recipe, cluster, overrides=[f"cluster.runs_root={root}", *extra], run_name="r")
    write_files(spec.path, render_all(spec))
    return spec.path


@pytest.fixture()
def fsdp_run(tmp_path: Path) -> Path:
    """A 1x4-GPU verl FSDP run with complete checkpoints at steps 2 and 4, saved at world size 4."""
    run = make_run(tmp_path, FSDP_RECIPE)
    trees.verl_fsdp(run, 2, world=4)
    trees.verl_fsdp(run, 4, world=4)
    return run


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "hpc_grpo.cli.app", *args], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "COLUMNS": "200", **(env or {})})


def fake_slurm(tmp_path: Path) -> tuple[dict[str, str], Path]:
    """PATH with sbatch/sinfo/squeue that only record that they were called: proof that nothing was queued."""
    bin_dir, calls = tmp_path / "fake-bin", tmp_path / "slurm-calls"
    bin_dir.mkdir()
    for tool in ("sbatch", "sinfo", "squeue", "sacct", "scontrol"):
        (bin_dir / tool).write_text(f'#!/bin/sh\necho "{tool} $*" >> {calls}\nexit 1\n')
        (bin_dir / tool).chmod(0o755)
    return {"PATH": f"{bin_dir}:{os.environ['PATH']}"}, calls


def test_resume_onto_more_nodes_is_refused_and_nothing_is_queued_or_written(fsdp_run: Path, tmp_path: Path) -> None:
    env, calls = fake_slurm(tmp_path)
    before = trees.tree_snapshot(fsdp_run)
    proc = cli("resume", str(fsdp_run), "resources.nodes=2", env=env)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    text = " ".join(proc.stderr.split())
    step4, export_dir = fsdp_run / "checkpoints" / "global_step_4", fsdp_run / "exports" / "step_4"
    for part in (str(step4), "saved at world size 4", "world size 8 (resources.nodes=2 x resources.gpus_per_node=4)",
                 "model_world_size_8_rank_*.pt",
                 f"(a) resume at world size 4: hpc-grpo resume {fsdp_run} resources.nodes=1 resources.gpus_per_node=4",
                 f"hpc-grpo export {fsdp_run} --step 4", f"(writes {export_dir})",
                 f"hpc-grpo submit recipe={FSDP_RECIPE} cluster=a100-ib", f"model.path={export_dir}"):
        assert part in text, (part, text)
    assert trees.tree_snapshot(fsdp_run) == before  # no spec, script, history, lease or checkpoint change
    assert not (fsdp_run / layout.HISTORY_FILE).exists() and not calls.exists(), calls.read_text() if calls.exists() else ""


def test_the_offered_fixes_are_commands_that_work(fsdp_run: Path) -> None:
    with pytest.raises(WorldSizeMismatch) as info:
        plan_resume(fsdp_run, ["resources.nodes=2"], force=False)
    exc = info.value
    assert exc.key == "resources" and exc.data == {
        "cause": "world size mismatch", "checkpoint": str(fsdp_run / "checkpoints" / "global_step_4"),
        "checkpoint_world_size": 4, "world_size": 8}
    lines = str(exc).splitlines()
    (back,) = [ln for ln in lines if "(a) resume" in ln]
    items = shlex.split(back.split(": ", 1)[1])[3:]  # after `hpc-grpo resume RUN`
    assert plan_resume(fsdp_run, items, force=False).step == 4
    submit = shlex.split(str(exc).rsplit(", then ", 1)[1])
    assert submit[:2] == ["hpc-grpo", "submit"]
    args = dict(a.split("=", 1) for a in submit[2:])
    new = resolve_spec(args.pop("recipe"), args.pop("cluster"), [f"{k}={v}" for k, v in args.items()], run_name="new")
    assert new.recipe.model.path == str(fsdp_run / "exports" / "step_4") and new.world_size == 8


def test_same_world_size_is_accepted_whatever_the_shape(fsdp_run: Path) -> None:
    assert plan_resume(fsdp_run, [], force=False).step == 4
    assert plan_resume(fsdp_run, ["resources.time=01:00:00"], force=False).step == 4
    plan = plan_resume(fsdp_run, ["resources.nodes=2", "resources.gpus_per_node=2"], force=False)
    assert plan.step == 4 and plan.spec.world_size == 4  # FSDP shards depend on the world size only


def test_a_refusal_does_not_hide_behind_force_but_a_finished_run_is_not_resubmitted(fsdp_run: Path) -> None:
    with pytest.raises(WorldSizeMismatch):
        plan_resume(fsdp_run, ["resources.nodes=2"], force=True)
    (fsdp_run / "train_done.json").write_text(json.dumps({"final_step": 4}))
    assert plan_resume(fsdp_run, ["resources.nodes=2"], force=False).finished is not None  # prints "nothing to resume"


def test_newest_complete_decides_not_an_older_size(fsdp_run: Path) -> None:
    """Steps 2 and 4 at world size 4, a newer step 6 at world size 8: resuming at 8 loads step 6, which fits."""
    trees.verl_fsdp(fsdp_run, 6, world=8)
    assert plan_resume(fsdp_run, ["resources.nodes=2"], force=False).step == 6
    with pytest.raises(WorldSizeMismatch, match="global_step_6 is a verl FSDP checkpoint saved at world size 8"):
        plan_resume(fsdp_run, [], force=False)


def test_megatron_run_may_change_size(tmp_path: Path) -> None:
    run = make_run(tmp_path, "qwen2.5-7b-codegen")  # verl Megatron, 1 node x 8 GPUs
    trees.verl_megatron(run, 4, world=8)
    plan = plan_resume(run, ["resources.nodes=2"], force=False)
    assert plan.step == 4 and plan.checkpoint.layout == "verl-megatron" and plan.spec.world_size == 16
    spec = load_frozen(run / layout.SPEC_FILE)
    assert pr.prepare(run, "verl", spec.model_copy(update={"recipe": plan.spec.recipe})).step == 4


def test_trl_run_may_change_size(tmp_path: Path) -> None:
    run = make_run(tmp_path, "tiny-gsm8k", cluster="local")
    trees.trl_checkpoint(run, 4)
    assert plan_resume(run, ["resources.nodes=2"], force=False).step == 4


# ----------------------------------------------------------------------------------------- in the job
def test_job_preparation_refuses_and_records_the_failure(tmp_path: Path) -> None:
    """A job whose spec says 2x4 GPUs finds step-4 shards of world size 4: it fails at once, before verl starts,
    moves nothing (not even the newer broken step 6) and says why in the history, which status shows."""
    run = make_run(tmp_path, FSDP_RECIPE, extra=("resources.nodes=2",))
    trees.verl_fsdp(run, 2, world=4)
    trees.verl_fsdp(run, 4, world=4)
    trees.truncate_half(trees.verl_fsdp(run, 6, world=4) / "data.pt")
    before = trees.tree_snapshot(run / "checkpoints")
    args_out = tmp_path / "resume-args"
    proc = subprocess.run([sys.executable, "-m", "hpc_grpo.job.prepare_resume", "--spec", str(run / layout.SPEC_FILE),
                           "--args-out", str(args_out)], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "SLURM_JOB_ID": "777"})
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "resume preparation failed" in proc.stderr and "saved at world size 4" in proc.stderr
    assert not args_out.exists()  # the launch script stops here (set -e): verl never starts
    assert trees.tree_snapshot(run / "checkpoints") == before and not (run / layout.QUARANTINE_DIR).exists()
    (entry,) = runs.read_history(run)
    assert (entry.job_id, entry.purpose) == ("777", "failed")
    assert entry.data["checkpoint_world_size"] == 4 and entry.data["world_size"] == 8
    assert "resources.nodes=1 resources.gpus_per_node=4" in entry.note and f"hpc-grpo export {run}" in entry.note
    assert status.run_status(run).failures == [f"job 777: {entry.note}"]


def test_job_preparation_at_the_same_size_resumes(fsdp_run: Path) -> None:
    prepared = pr.prepare_and_record(fsdp_run, "verl", load_frozen(fsdp_run / layout.SPEC_FILE))
    assert prepared.step == 4 and [e.purpose for e in runs.read_history(fsdp_run)] == ["start"]


# ----------------------------------------------------------------------------------------- hpc-grpo export
FAKE_MERGER = """#!/bin/sh
# stands in for `python -m verl.model_merger merge --backend fsdp --local_dir ACTOR --target_dir OUT`
echo "$@" > "{log}"
while [ $# -gt 0 ]; do [ "$1" = --target_dir ] && out="$2"; shift; done
mkdir -p "$out" && echo '{{"model_type": "qwen2"}}' > "$out/config.json" && echo weights > "$out/model.safetensors"
"""


def test_export_command_writes_the_folder_the_refusal_names(fsdp_run: Path, tmp_path: Path) -> None:
    merger, log = tmp_path / "fake-python", tmp_path / "merger-args"
    merger.write_text(FAKE_MERGER.format(log=log))
    merger.chmod(0o755)
    proc = cli("export", str(fsdp_run), env={"HPC_GRPO_VERL_PYTHON": str(merger)})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    folder = fsdp_run / "exports" / "step_4"
    assert f"Exported: {folder} (verl model_merger (fsdp))" in proc.stdout
    assert f"hpc-grpo submit recipe={FSDP_RECIPE} cluster=a100-ib" in proc.stdout and f"model.path={folder}" in proc.stdout
    args = log.read_text().split()
    assert args[:8] == ["-m", "verl.model_merger", "merge", "--backend", "fsdp", "--local_dir",
                        str(fsdp_run / "checkpoints" / "global_step_4" / "actor"), "--target_dir"]
    # the merger writes inside the export's hidden temp folder, beside where the export lands
    work = Path(args[8]).parent
    assert work.parent == fsdp_run / "exports" and work.name.startswith(".step_4.") and not work.exists()
    info = export.export_info(folder)
    assert info["step"] == 4 and info["layout"] == "verl-fsdp" and info["source"].endswith("global_step_4")
    assert (folder / "config.json").is_file() and (folder / "tokenizer_config.json").is_file()
    assert not list((fsdp_run / "leases").glob("*.lease"))  # the reader lease is gone

    proc = cli("export", str(fsdp_run), "--step", "2", env={"HPC_GRPO_VERL_PYTHON": str(merger)})
    assert proc.returncode == 0 and (fsdp_run / "exports" / "step_2" / layout.EXPORT_MARKER).is_file(), proc.stderr
    proc = cli("export", str(fsdp_run), "--step", "3")
    assert proc.returncode == 2 and "--step" in proc.stderr and "complete: 2, 4" in proc.stderr, proc.stderr
