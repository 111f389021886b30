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
