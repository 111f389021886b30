"""The reward registry (hpc_grpo/config/reward_registry.py) and the eval-task registry (hpc_grpo/config/eval_tasks.py):
every entry's import paths resolve, recipes are checked against them, and a reward added as one entry is what
plan, render, trl and `hpc-grpo data` use, with no other file touched. The fake reward here is a test module of its own (a real
function, importable by the same "pkg://" path verl would load)."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from hpc_grpo.common.loading import load_object
from hpc_grpo.config import eval_tasks
from hpc_grpo.config import reward_registry as registry
from hpc_grpo.config.data_sets import MATH, DataOption, DataSet
from hpc_grpo.config.resolve import resolve_spec
from hpc_grpo.config.spec import Recipe, default_eval_tasks

REPO = Path(__file__).resolve().parents[2]

FAKE = "length_bonus"


# The fake reward's module parts: verl's compute_score and trl's factory, both in this file.
def compute_score(data_source: str, solution_str: str, ground_truth: str, extra_info: Any = None,
                  scale: float = 1.0, **_: Any) -> float:
    return scale * min(len(solution_str), 10) / 10


def make_trl_reward(scale: float = 1.0) -> Any:
    def length_bonus(completions: list[Any], ground_truth: list[Any], **kwargs: Any) -> list[float]:
        return [compute_score("", str(c), str(g), scale=scale) for c, g in zip(completions, ground_truth)]

    return length_bonus


@pytest.fixture
def fake_reward() -> Iterator[registry.Reward]:
    entry = registry.register(registry.Reward(
        FAKE, module=__name__, trl_factory="make_trl_reward", eval_task="math", data=MATH, runs_code=True,
        kwargs=lambda r: {"scale": (r.grpo.format_score + 1, "grpo.format_score")}))
    yield entry
    registry.unregister(FAKE)


@pytest.mark.parametrize("name", registry.names())
def test_every_reward_entry_resolves(name: str) -> None:
    entry = registry.get(name)
    module = importlib.import_module(entry.module)
    assert callable(getattr(module, entry.verl_function)), "verl's custom_reward_function name"
    assert callable(getattr(module, entry.trl_factory))
    assert callable(load_object(entry.data.preparer))
    if entry.ground_truth_check:
        assert callable(load_object(entry.ground_truth_check))
    if entry.eval_task is None:  # a reward no eval task measures: nothing evaluated unless the recipe says
        assert default_eval_tasks(name) == []
    else:
        assert entry.eval_task in eval_tasks.names()
        assert default_eval_tasks(name) == [entry.eval_task]


@pytest.mark.parametrize("name", eval_tasks.names())
def test_every_eval_task_entry_resolves(name: str) -> None:
    task = eval_tasks.get(name)
    assert callable(load_object(task.scorer))
    assert task.metrics and all(key and label for key, label in task.metrics)
    if task.runs_lm_eval:
        from hpc_grpo.evaluation.scoring import lm_eval_tasks_dir

        assert (lm_eval_tasks_dir() / str(task.lm_eval_yaml)).is_file(), "the installed lm-eval has this YAML"
        assert task.files and task.data_command


def test_the_trl_factory_of_each_shipped_reward_builds_a_scoring_function(isolated: Path) -> None:
    for name in ("gsm8k_strict", "gsm8k_flexible", "math_boxed"):
        spec = resolve_spec("tiny-gsm8k", "local", [f"grpo.reward={name}", "grpo.format_score=0.1"])
        reward = registry.trl_reward(spec.recipe)
        right = "#### 7" if name.startswith("gsm8k") else "\\boxed{7}"
        assert reward([right, right.replace("7", "8")], ground_truth=["7", "7"]) == [1.0, 0.1]


def test_unknown_reward_and_task_are_refused_naming_the_choices() -> None:
    base = {"name": "x", "model": {"path": "/m"}, "data": {"train_files": "/a", "val_files": "/b"}}
    with pytest.raises(ValidationError, match="unknown reward 'gsm8k_strikt'.*math_boxed"):
        Recipe.model_validate({**base, "grpo": {"reward": "gsm8k_strikt"}})
    with pytest.raises(ValidationError, match="unknown eval task 'maths'.*math"):
        Recipe.model_validate({**base, "eval": {"tasks": ["maths"]}})


def test_a_reward_added_as_one_entry_is_used_by_plan_render_and_trl(isolated: Path, fake_reward: Any) -> None:
    from hpc_grpo.engines.verl import modelled_overrides
    from hpc_grpo.job.trl_job import reward_function
    from hpc_grpo.launch.render import render_all
    from hpc_grpo.planning.plan import run_plan, runs_policy_code

    # verl: the entry's module by pkg://, its kwargs with the recipe key they come from, in the rendered launch
    spec = resolve_spec("tiny-verl", "local", [f"grpo.reward={FAKE}", "grpo.format_score=0.5"])
    crf = {o.key: (o.value, o.source) for o in modelled_overrides(spec) if "custom_reward_function" in o.key}
    assert crf == {"reward.custom_reward_function.path": (f"pkg://{__name__}", "grpo.reward"),
                   "reward.custom_reward_function.name": ("compute_score", "grpo.reward"),
                   "+reward.custom_reward_function.reward_kwargs.scale": (1.5, "grpo.format_score")}
    assert default_eval_tasks(FAKE) == ["math"]  # the entry's eval task, for a recipe that sets none
    launch = "\n".join(render_all(spec).values())
    assert f"reward.custom_reward_function.path=pkg://{__name__}" in launch
    # plan: runs_code puts the code sandbox's check on the run
    assert runs_policy_code(spec)
    plan = run_plan(resolve_spec("tiny-gsm8k", "local", [f"grpo.reward={FAKE}", "grpo.code.isolation=limits-only"]),
                    schema=False)
    assert any(f.key == "grpo.code.isolation" and "limits-only" in f.message for f in plan.findings)
    # trl: the entry's factory with the same kwargs
    reward = reward_function(resolve_spec("tiny-gsm8k", "local", [f"grpo.reward={FAKE}", "grpo.format_score=1"]))
    assert reward.__name__ == "length_bonus"
    assert reward(["12345"], ground_truth=["x"]) == [1.0]  # scale 2 x 5/10


def test_verl_renders_no_custom_function_where_its_own_scorer_agrees(isolated: Path) -> None:
    from hpc_grpo.engines.verl import modelled_overrides

    def crf(*overrides: str) -> dict[str, object]:
        spec = resolve_spec("tiny-verl", "local", list(overrides))
        return {o.key: o.value for o in modelled_overrides(spec) if "custom_reward_function" in o.key}

    assert crf("grpo.reward=gsm8k_strict", "grpo.format_score=0") == {}  # verl's built-in GSM8K scorer
    assert crf("grpo.reward=math_boxed", "grpo.format_score=0")["reward.custom_reward_function.path"] == \
        "pkg://hpc_grpo.rewards.math_boxed"
    code = crf("grpo.reward=code_exec")
    assert code["reward.custom_reward_function.path"] == "pkg://hpc_grpo.rewards.code"
    assert code["+reward.custom_reward_function.reward_kwargs.isolation"] == "auto"


def test_data_math_writes_both_engines_rows_and_the_eval_source(isolated: Path) -> None:
    import pyarrow.parquet as pq

    from hpc_grpo.data.gsm8k import DataError
    from hpc_grpo.data.math import SHIPPED_PROBLEMS, prepare_math

    out = prepare_math(SHIPPED_PROBLEMS, isolated / "math", test_every=3)
    n = len(SHIPPED_PROBLEMS.read_text().splitlines())
    assert (out.n_train, out.n_test) == (n - n // 3, n // 3)
    verl = pq.read_table(out.verl_train).to_pylist()
    trl = [json.loads(line) for line in out.trl_train.read_text().splitlines()]
    assert [r["reward_model"]["ground_truth"] for r in verl] == [r["ground_truth"] for r in trl]
    assert verl[1]["reward_model"]["ground_truth"] == "\\frac{3}{4}"  # the solution's last box, braces kept
    assert "\\boxed{}" in trl[0]["prompt"][0]["content"]
    source = json.loads((isolated / "math" / "source.json").read_text())
    raw = [json.loads(line) for line in (Path(source["raw_dir"]) / "test.jsonl").read_text().splitlines()]
    assert source["data"] == "math" and set(raw[0]) == {"problem", "solution"}
    bad = isolated / "bad.jsonl"
    bad.write_text('{"problem": "1+1?", "solution": "two"}\n')
    with pytest.raises(DataError, match=r"bad.jsonl:1: no answer"):
        prepare_math(bad, isolated / "bad")
    assert not (isolated / "bad").exists()


def test_a_math_recipe_finds_its_eval_files_and_mixing_data_sets_is_refused(isolated: Path) -> None:
    from hpc_grpo.common.yamlio import SpecError
    from hpc_grpo.data.math import SHIPPED_PROBLEMS, prepare_math
    from hpc_grpo.evaluation.evaluate import data_files

    out = prepare_math(SHIPPED_PROBLEMS, isolated / "math")
    spec = resolve_spec("tiny-math", "local", [f"data.train_files={out.trl_train}", f"data.val_files={out.trl_test}"])
    train, test = data_files(spec)
    assert Path(test) == (isolated / "math" / "raw" / "test.jsonl").resolve()
    with pytest.raises(SpecError, match="different data sets"):
        data_files(spec, ["math", "gsm8k"])
    with pytest.raises(SpecError, match="no question/answer files for lm-eval's gsm8k"):
        data_files(spec, ["gsm8k"])  # a MATH source.json is not GSM8K's


# ------------------------------------------------------------------------------------------------ `hpc-grpo data`
def prepare_lengths(out_dir: Path, rows: int = 3, word: str = "ab") -> Any:
    """The fake reward's data preparer: `rows` rows of growing length (what length_bonus scores)."""
    from hpc_grpo.data.gsm8k import PrepareResult

    (out_dir / "trl").mkdir(parents=True)
    lines = [json.dumps({"prompt": word * (i + 1), "ground_truth": ""}) for i in range(rows)]
    for split in ("train", "test"):
        (out_dir / "trl" / f"{split}.jsonl").write_text("\n".join(lines) + "\n")
    return PrepareResult(out_dir, out_dir / "none", out_dir / "none", out_dir / "trl" / "train.jsonl",
                         out_dir / "trl" / "test.jsonl", rows, rows, f"{rows} x {word}")


LENGTHS = DataSet("lengths", f"{__name__}:prepare_lengths", "Write rows of growing length for length_bonus.",
                  "length rows", (DataOption("rows", int, 3, "how many rows"),
                                  DataOption("word", str, "ab", "the repeated word", flag="--unit")))


def test_a_reward_registered_with_its_data_set_gets_its_data_command(isolated: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """One entry, no CLI edit: the data app built from the registries lists it, with its options, and runs its
    preparer into $HPC_GRPO_DATA/NAME."""
    import typer
    from typer.testing import CliRunner

    from hpc_grpo.cli.data_cmds import add_data_commands

    registry.register(registry.Reward(FAKE, module=__name__, trl_factory="make_trl_reward", eval_task=None,
                                      data=LENGTHS))
    try:
        app = typer.Typer(no_args_is_help=True)
        add_data_commands(app)
        runner = CliRunner()
        listing = runner.invoke(app, ["--help"]).output
        assert "lengths" in listing and "Write rows of growing length" in listing
        for shipped in ("gsm8k", "codegen", "math", "countdown"):
            assert shipped in listing
        assert "--unit" in runner.invoke(app, ["lengths", "--help"]).output
        monkeypatch.setenv("HPC_GRPO_DATA", str(isolated / "data"))
        result = runner.invoke(app, ["lengths", "--rows", "4", "--unit", "xy"])
        assert result.exit_code == 0, result.output
        rows = (isolated / "data" / "lengths" / "trl" / "train.jsonl").read_text().splitlines()
        assert [json.loads(r)["prompt"] for r in rows] == ["xy", "xyxy", "xyxyxy", "xyxyxyxy"]
        assert default_eval_tasks(FAKE) == []
    finally:
        registry.unregister(FAKE)


def test_each_data_command_is_defined_once_and_the_cli_lists_them_all() -> None:
    """Rewards and eval tasks reading one data set share its DataSet; the installed CLI lists every one."""
    from hpc_grpo.cli.data_cmds import data_sets

    named = {r.data.name for r in registry.all_rewards()} | {t.data_command for t in eval_tasks.all_tasks()
                                                            if t.data_command}
    listed = [d.name for d in data_sets()]
    assert sorted(listed) == sorted(named)  # each once
    for task in eval_tasks.all_tasks():  # an eval task reading a reward's data names the same DataSet object
        for reward in registry.all_rewards():
            if task.data is not None and reward.data.name == task.data.name:
                assert reward.data == task.data
    listing = subprocess.run([sys.executable, "-m", "hpc_grpo.cli", "data", "--help"], capture_output=True,
                             text=True, check=True, env={**os.environ, "PYTHONPATH": str(REPO)}).stdout
    for name in named:
        assert f"  {name} " in listing, (name, listing)


def test_two_different_data_sets_under_one_name_are_refused() -> None:
    from hpc_grpo.cli.data_cmds import data_sets

    clash = DataSet("math", "hpc_grpo.data.math:prepare_math", "another math", "MATH problems")
    registry.register(registry.Reward(FAKE, module=__name__, trl_factory="make_trl_reward", eval_task=None,
                                      data=clash))
    try:
        with pytest.raises(ValueError, match="define `hpc-grpo data math` differently"):
            list(data_sets())
    finally:
        registry.unregister(FAKE)
