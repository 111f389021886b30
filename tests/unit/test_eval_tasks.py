"""Which tasks a recipe evaluates after training: one rule (config.spec.default_eval_tasks), applied where the recipe is
validated, so the frozen spec, plan, preflight and the eval job read the same list.

A recipe whose reward trains code (grpo.reward=code_exec) evaluates humaneval and needs no GSM8K file; any other
evaluates gsm8k; eval.tasks set in the recipe or on the command line wins. plan and submit say which tasks the
eval job will run.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from hpc_grpo.config import registry
from hpc_grpo.config.resolve import load_frozen, load_raw, resolve_spec
from hpc_grpo.config.spec import Eval, Grpo, Recipe, default_eval_tasks
from hpc_grpo.evaluation import evaluate
from hpc_grpo.planning.plan import run_plan
from hpc_grpo.runstate import layout

CODEGEN = ("tiny-codegen", "qwen2.5-7b-codegen")
CLUSTER = {"tiny-codegen": "slurm-dev", "qwen2.5-7b-codegen": "a100-ib"}


def spec_of(recipe: str, root: Path, *overrides: str):
    return resolve_spec(recipe, CLUSTER.get(recipe, "slurm-dev"), [f"cluster.runs_root={root}", *overrides],
                        run_name="t")


def test_the_rule() -> None:
    assert default_eval_tasks("code_exec") == ["humaneval"]
    assert default_eval_tasks("gsm8k_strict") == default_eval_tasks("gsm8k_flexible") == ["gsm8k"]
    assert Eval().tasks == ["gsm8k"]  # the schema's default reward is gsm8k_strict


@pytest.mark.parametrize("name", registry.list_names("recipes"))
def test_every_shipped_recipe_without_eval_tasks_follows_its_reward(name: str, isolated: Path) -> None:
    raw, _ = load_raw("recipes", name)
    spec = spec_of(name, isolated)
    r = spec.recipe
    if (raw.get("eval") or {}).get("tasks") is None:
        assert r.eval.tasks == default_eval_tasks(r.grpo.reward), (name, r.eval.tasks)
    if r.grpo.reward == "code_exec":
        assert not evaluate.needs_files(r.eval.tasks), (name, r.eval.tasks)


@pytest.mark.parametrize("name", CODEGEN)
def test_codegen_recipes_evaluate_humaneval_with_no_gsm8k_file(name: str, isolated: Path) -> None:
    spec = spec_of(name, isolated)
    assert spec.recipe.eval.enabled and spec.recipe.eval.tasks == ["humaneval"]
    settings = evaluate.settings_for(spec)  # would raise SpecError if it looked for GSM8K files
    assert settings.tasks == ("humaneval",) and (settings.train_file, settings.test_file) == ("", "")
    for for_submit in (False, True):
        findings = run_plan(spec, schema=False, for_submit=for_submit).findings
        assert not [f for f in findings if f.key.startswith("eval.")], [str(f) for f in findings]
    # the check is live: asked for GSM8K as well, the same plan wants its files
    spec = spec_of(name, isolated, "eval.tasks=[humaneval,gsm8k]")
    findings = run_plan(spec, schema=False, for_submit=True).findings
    assert [f.key for f in findings if f.key == "eval.test_file"] == ["eval.test_file"], [str(f) for f in findings]


def test_a_set_list_wins_and_null_means_the_default(isolated: Path) -> None:
    assert spec_of("tiny-codegen", isolated, "eval.tasks=[gsm8k]").recipe.eval.tasks == ["gsm8k"]
    assert spec_of("tiny-codegen", isolated, "eval.tasks=null").recipe.eval.tasks == ["humaneval"]
    assert spec_of("tiny-gsm8k", isolated, "eval.tasks=null").recipe.eval.tasks == ["gsm8k"]
    # a GSM8K recipe switched to the code reward on the command line follows it unless it names its tasks
    raw, _ = load_raw("recipes", "qwen2.5-3b-gsm8k-lora")
    assert "tasks" not in (raw.get("eval") or {})
    assert spec_of("qwen2.5-3b-gsm8k-lora", isolated, "grpo.reward=code_exec").recipe.eval.tasks == ["humaneval"]


def test_recipes_built_in_code_follow_the_same_rule() -> None:
    base = {"name": "x", "model": {"path": "/m"}, "data": {"train_files": "/a", "val_files": "/b"}}
    assert Recipe(**base).eval.tasks == ["gsm8k"]
    assert Recipe(**base, grpo={"reward": "code_exec"}).eval.tasks == ["humaneval"]
    assert Recipe(**base, grpo=Grpo(reward="code_exec"), eval=Eval(limit=3)).eval.tasks == ["humaneval"]
    assert Recipe(**base, grpo=Grpo(reward="code_exec"), eval=Eval(limit=3)).eval.limit == 3
    assert Recipe(**base, grpo=Grpo(reward="code_exec"), eval=Eval(tasks=["gsm8k"])).eval.tasks == ["gsm8k"]
    assert Recipe(**base, grpo={"reward": "code_exec"}, eval={"tasks": ["gsm8k_cot"]}).eval.tasks == ["gsm8k_cot"]


def test_the_frozen_spec_records_the_list(isolated: Path) -> None:
    """The eval job reads the frozen spec: it must name humaneval itself, not leave it to be re-derived."""
    from hpc_grpo.launch.render import render_all

    spec = spec_of("tiny-codegen", isolated)
    text = render_all(spec)[layout.SPEC_FILE]
    path = isolated / layout.SPEC_FILE
    path.write_text(text)
    assert load_frozen(path).recipe.eval.tasks == ["humaneval"]
    assert "- humaneval" in text


@pytest.mark.parametrize(("recipe", "words"), [
    ("tiny-codegen", ["Evaluation: humaneval (first 4 problems) on hf, cpu, 0 GPU(s): a Slurm job queued afterany"]),
    ("qwen2.5-7b-codegen", ["Evaluation: humaneval on hf, cuda, 1 GPU(s): a Slurm job queued afterany"]),
    ("qwen2.5-3b-gsm8k-lora", ["Evaluation: gsm8k on vllm, cuda, 4 GPU(s)"]),
])
def test_plan_says_which_tasks_the_eval_job_runs(recipe: str, words: list[str], isolated: Path,
                                                 monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    from hpc_grpo.cli import app as cli

    cluster = CLUSTER.get(recipe, "a100-ib")
    base = ["recipe=" + recipe, f"cluster={cluster}", f"cluster.runs_root={isolated}", "--no-schema"]
    monkeypatch.setattr(sys, "argv", ["hpc-grpo", "plan", *base])
    with pytest.raises(SystemExit):
        cli.main()
    text = " ".join(capsys.readouterr().out.split())
    for word in words:
        assert word in text, text
    monkeypatch.setattr(sys, "argv", ["hpc-grpo", "plan", "--json", *base])
    with pytest.raises(SystemExit):
        cli.main()
    data = json.loads(capsys.readouterr().out)
    assert data["eval"]["tasks"] == spec_of(recipe, isolated).recipe.eval.tasks
    assert data["eval"]["data_files"] is evaluate.needs_files(data["eval"]["tasks"])


def test_disabled_and_local_evaluations_are_described(isolated: Path) -> None:
    off = evaluate.summary(spec_of("tiny-codegen", isolated, "eval.enabled=false"))
    assert off["enabled"] is False and "eval.enabled=false" in evaluate.describe(off)
    local = resolve_spec("tiny-codegen", "local", [f"cluster.runs_root={isolated}"], run_name="t")
    assert "in the training job" in evaluate.describe(evaluate.summary(local))
    chain = evaluate.summary(spec_of("qwen2.5-7b-codegen", isolated, "cluster.restart=chain"))
    assert chain["where"].startswith("not queued") and chain["tasks"] == ["humaneval"]
