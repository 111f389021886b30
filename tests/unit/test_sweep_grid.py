"""A sweep's members from its command line (config.sweep_grid), its --array value (cluster.sbatch.array), its one
batch script (launch.render.render_array_sbatch), and the sweeps refused before anything is planned or queued."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpc_grpo.cluster import sbatch
from hpc_grpo.common.yamlio import SpecError
from hpc_grpo.config.resolve import resolve_spec
from hpc_grpo.config.sweep_grid import members, split_axes
from hpc_grpo.launch import render
from hpc_grpo.runstate import layout
from tests.cli_run import run_cli


def test_brackets_are_axes_unless_the_field_holds_a_list() -> None:
    grid = split_axes(["grpo.lr=[1e-6,3e-6]", "eval.tasks=[gsm8k]", "grpo.n=[4, 8]", "train.total_training_steps=3",
                       "launch.driver=[python3,-m,x]"])
    assert grid.axes == {"grpo.lr": ["1e-6", "3e-6"], "grpo.n": ["4", "8"]}
    assert grid.base == ["eval.tasks=[gsm8k]", "train.total_training_steps=3", "launch.driver=[python3,-m,x]"]
    assert grid.size == 4


@pytest.mark.parametrize("items,words", [
    (["grpo.lr=[]"], "sweeps no value"),
    (["grpo.lr=[1e-6,1e-6]"], "lists a value twice"),
    (["grpo.lr=[1e-6]", "grpo.lr=[3e-6]"], "swept twice"),
])
def test_bad_axes_are_refused(items: list[str], words: str) -> None:
    with pytest.raises(SpecError, match=words) as exc:
        split_axes(items)
    assert exc.value.key == "grpo.lr"


def test_grid_in_order_and_random_draws_repeatable() -> None:
    grid = split_axes(["grpo.lr=[1,2,3]", "grpo.n=[4,8]"])
    every = members(grid)
    assert every[:3] == [["grpo.lr=1", "grpo.n=4"], ["grpo.lr=1", "grpo.n=8"], ["grpo.lr=2", "grpo.n=4"]]
    assert len(every) == 6
    drawn = members(grid, random_k=3, seed=7)
    assert drawn == members(grid, random_k=3, seed=7) and len(drawn) == 3
    assert all(d in every for d in drawn) and len({tuple(d) for d in drawn}) == 3
    with pytest.raises(SpecError, match="more members than the grid's 6"):
        members(grid, random_k=7)
    with pytest.raises(SpecError, match="no axis to sweep"):
        members(split_axes(["grpo.lr=1"]))


def test_array_option() -> None:
    assert sbatch.array([0, 1, 2, 3], 2) == "0-3%2"
    assert sbatch.array([3, 1], 2) == "1,3%2"
    assert sbatch.array([5], 4) == "5%1"  # never more in flight than tasks


def test_array_script_runs_task_i_in_member_i(tmp_path: Path) -> None:
    spec = resolve_spec("tiny-gsm8k", "slurm-dev", [f"cluster.runs_root={tmp_path}"], run_name="sw")
    folder = tmp_path / "sw"
    pattern = spec.model_copy(update={"run_dir": str(layout.member_dir(folder, "sw", "%a"))})
    text = render.render_array_sbatch(pattern, "python -u -m submitit.core._submit X", [("array", "0-3%2")],
                                      str(layout.member_dir(folder, "sw", "")), ["hpc-grpo", "sweep", "recipe=x"])
    assert "#SBATCH --array=0-3%2\n" in text
    assert f"#SBATCH --output={folder}/sw-m%a/submitit/%A_%a_0_log.out\n" in text
    assert f"--output {folder}/sw-m%a/submitit/%A_%a_%t_log.out" in text
    assert f'export HPC_GRPO_RUN_DIR={folder}/sw-m"$SLURM_ARRAY_TASK_ID"\n' in text
    assert "#   hpc-grpo sweep recipe=x\n" in text
    single = render.render_sbatch(spec)  # a run's own script keeps its job id and its one folder
    assert "%A_%a" not in single and f"export HPC_GRPO_RUN_DIR={tmp_path}/sw\n" in single


@pytest.mark.parametrize("args,words", [
    (["cluster=local", "grpo.lr=[1e-2,2e-2]"], "a sweep is a Slurm job array"),
    (["cluster=slurm-dev", "resources.cpus_per_task=[1,2]"], "member 1 (resources.cpus_per_task=2) asks Slurm for "
                                                             "another allocation than member 0: cpus_per_task 2"),
    (["cluster=slurm-dev", "grpo.n=[4,zero]"], "member 1 (grpo.n=zero) is invalid"),
], ids=["local", "other-allocation", "invalid-member"])
def test_sweeps_refused_before_anything_is_queued(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
                                                  tmp_path: Path, args: list[str], words: str) -> None:
    code, text = run_cli(monkeypatch, capsys, "sweep", "recipe=tiny-gsm8k", f"cluster.runs_root={tmp_path}", *args,
                         "--name", "sw")
    assert code == 2, text
    assert words in " ".join(text.split()), text
    assert not (tmp_path / "sw").exists()


# ------------------------------------------------------------------------------------------ successive halving
def test_rung_cutoff_keeps_the_top_one_over_eta() -> None:
    from hpc_grpo.job.early_stop import halved, rung_cutoff

    assert rung_cutoff([], 2, "max") is None and halved(0.0, [], 2, "max") == (False, None)  # the first goes on
    assert rung_cutoff([0.1, 0.3], 2, "max") == pytest.approx(0.2)
    assert halved(0.15, [0.1, 0.3], 2, "max") == (True, pytest.approx(0.2))
    assert halved(0.25, [0.1, 0.3], 2, "max")[0] is False
    assert halved(0.31, [0.1, 0.2, 0.3, 0.4], 4, "max")[0] is True  # top 1/4 of 0.1..0.4 starts at 0.325
    assert halved(0.2, [0.1, 0.3], 2, "min")[0] is False and halved(0.25, [0.1, 0.3], 2, "min")[0] is True
    assert halved(0.3, [0.3, 0.3], 2, "max")[0] is False  # a tie is not behind


def test_a_member_reads_what_the_others_logged_at_the_rung(tmp_path: Path) -> None:
    import json

    from hpc_grpo.runstate import sweeps

    members = [sweeps.Member(i, layout.member_name("sw", i), [f"grpo.lr={i}"]) for i in range(3)]
    manifest = sweeps.Manifest("sw", "tiny-gsm8k", "slurm-dev", [], {"grpo.lr": ["0", "1", "2"]}, members, 2,
                               rungs=[2], metric="eval_reward")
    sweeps.write_manifest(tmp_path, manifest)
    rows = {0: [{"step": 2, "reward": 0.5}, {"step": 2, "eval_reward": 0.25}], 1: [{"step": 1, "eval_reward": 0.9}]}
    for i, lines in rows.items():
        run = layout.member_dir(tmp_path, "sw", i)
        run.mkdir()
        (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    found = sweeps.member_of(layout.member_dir(tmp_path, "sw", 2))
    assert found is not None and found[2].index == 2 and found[1].rungs == [2]
    # member 1 has not reached step 2 yet; member 0's two lines of step 2 are one row
    assert sweeps.rung_values(tmp_path, found[1], 2, found[2]) == [0.25]
    assert sweeps.member_of(tmp_path / "elsewhere") is None


@pytest.mark.parametrize("args,words", [
    (["--rungs", "4", "train.total_training_steps=4"], "every rung ([4]) must be a step before its last"),
    (["--rungs", "2", "--metric", "eval_reward", "train.total_training_steps=4"], "does not validate at every rung"),
    (["--rungs", "2", "--eta", "1", "train.total_training_steps=4"], "--eta 1: at least 2"),
], ids=["rung-at-the-end", "no-validation", "eta"])
def test_halving_refused_before_anything_is_queued(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
                                                   tmp_path: Path, args: list[str], words: str) -> None:
    code, text = run_cli(monkeypatch, capsys, "sweep", "recipe=tiny-gsm8k", "cluster=slurm-dev",
                         f"cluster.runs_root={tmp_path}", "grpo.lr=[1e-2,2e-2]", *args, "--name", "sw")
    assert code == 2, text
    assert words in " ".join(text.split()), text
    assert not (tmp_path / "sw").exists()
