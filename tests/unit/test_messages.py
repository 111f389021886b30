"""Messages through the real CLI: a verl key typo gets the closest real key (with or without '+', the key never
mangled), a value YAML typed gets a hint to quote it (and the quoted form works), and one bad rollout TP is one
error. Input errors exit 2; a plan refused by its findings exits 1 (README: "An error finding exits 1")."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpc_grpo.config import registry
from hpc_grpo.config.resolve import resolve_spec
from hpc_grpo.engines.verl import VerlEngine
from hpc_grpo.engines.verl_schema import key_tree, plus_typos
from tests.cli_run import run_plan

TYPO = "actor_rollout_ref.actor.clip_ratio_hgh"
REAL = "actor_rollout_ref.actor.clip_ratio_high"


def findings(text: str, key: str) -> list[str]:
    return [ln.strip() for ln in text.splitlines() if ln.strip().startswith(("error: " + key, "warning: " + key))]




def test_a_verl_typo_gets_the_closest_real_key_and_an_unmangled_fix(verl_yamls, isolated, monkeypatch, capsys) -> None:
    code, text = run_plan(monkeypatch, capsys, "recipe=tiny-verl", f"{TYPO}=0.3")
    assert code == 1, text
    [line] = findings(text, f"engine.{TYPO}")
    assert f"'{TYPO}=0.3': verl's config rejects it" in line
    assert f"Fix: did you mean {REAL}=0.3? To add a new key on purpose, use +{TYPO}=0.3" in line
    assert f"{TYPO}.clip_ratio_hgh" not in text


@pytest.mark.parametrize("typo,meant", [
    ("trainer.balance_bach", "trainer.balance_batch"),  # a section verl reads as a plain dict
    ("actor_rollout_ref.actr.clip_ratio_high", REAL),  # the typo in a section's name
])
def test_a_plus_key_one_letter_from_a_real_key_is_a_typo(typo, meant, verl_yamls, isolated, monkeypatch, capsys) -> None:
    code, text = run_plan(monkeypatch, capsys, "recipe=tiny-verl", f"+{typo}=0.3")
    assert code == 1, text
    [line] = findings(text, f"engine.{typo}")
    assert f"'+{typo}=0.3' adds a new key, and verl's config has '{meant}'" in line
    assert "almost always a typo" in line
    assert f"Fix: set {meant}=0.3 (no '+' for an existing key); to add the new key on purpose, write ++{typo}=0.3" in line


def test_a_plus_typo_in_a_dataclass_section_is_one_error_quoting_verls_failure(verl_yamls, isolated, monkeypatch,
                                                                               capsys) -> None:
    """verl builds actor_rollout_ref.actor as FSDPActorConfig: the typo fails at start-up (even with ++), so the
    one finding is the dataclass's, with the closest field; not a second 'typo' error for the same key."""
    for override in (f"+{TYPO}=0.3", f"++{TYPO}=0.3"):
        code, text = run_plan(monkeypatch, capsys, "recipe=tiny-verl", override)
        assert code == 1, text
        [line] = findings(text, f"engine.{TYPO}")
        assert "unexpected keyword argument 'clip_ratio_hgh'" in line and f"did you mean {REAL}?" in line, line


def test_plus_plus_adds_the_near_key_on_purpose_and_a_distinct_new_key_passes(verl_yamls, isolated, monkeypatch,
                                                                              capsys) -> None:
    for override in ("++trainer.balance_bach=0.3", "+trainer.my_new_setting=1"):
        _, text = run_plan(monkeypatch, capsys, "recipe=tiny-verl", override)
        assert "engine." not in text, text
        assert "'ppo_trainer' and checked against its config dataclasses" in text and "config hash): ok" in text, text


@pytest.mark.parametrize("recipe", registry.list_names("recipes"))
def test_no_shipped_recipe_renders_a_plus_key_that_looks_like_a_typo(recipe: str, verl_yamls, tmp_path: Path) -> None:
    spec = resolve_spec(recipe, "a100-ib", [f"cluster.runs_root={tmp_path}"], run_name="r")
    if spec.recipe.engine != "verl":
        return
    cmd = VerlEngine().command(spec)
    assert plus_typos(cmd.overrides, key_tree(cmd.config_name, verl_yamls)) == []


@pytest.mark.parametrize("typed,kind", [("0", "a number"), ("1.5", "a number"), ("true", "a boolean"),
                                        ("null", "nothing (null)")])
def test_a_value_yaml_typed_gets_a_hint_to_quote_it(typed, kind, isolated, monkeypatch, capsys) -> None:
    code, text = run_plan(monkeypatch, capsys, "recipe=tiny-verl", f"cluster.env.MY_FLAG={typed}")
    assert code == 2, text
    assert "error: cluster.env.MY_FLAG: Input should be a valid string" in text
    assert (f"YAML read it as {kind}: quote what you typed to keep it text, e.g. cluster.env.MY_FLAG='\"{typed}\"' "
            f"on the command line") in text
    assert f'MY_FLAG: "{typed}" in a file' in text


def test_the_quoted_form_the_hint_gives_is_accepted(tmp_path: Path) -> None:
    spec = resolve_spec("tiny-verl", "local", [f"cluster.runs_root={tmp_path}", 'cluster.env.MY_FLAG="0"'], run_name="r")
    assert spec.cluster.env["MY_FLAG"] == "0"


def test_one_bad_rollout_tp_is_one_error_naming_every_rule_and_the_good_values(isolated, monkeypatch, capsys) -> None:
    code, text = run_plan(monkeypatch, capsys, "recipe=qwen2.5-3b-gsm8k-lora", "cluster=a100-ib", "parallel.rollout_tp=3")
    assert code == 1, text
    errors = [ln for ln in text.splitlines() if ln.strip().startswith("error:")]
    assert errors == [
        "  error: parallel.rollout_tp: 3: does not divide the 4 GPUs per node (vLLM's tensor-parallel groups stay "
        "inside a node); and it cannot split Qwen2.5-3B-Instruct's 16 attention heads / 2 KV heads evenly "
        "Fix: use parallel.rollout_tp=1 or 2 or 4"], text


def test_rollout_tp_on_verl_cpu_is_one_error(isolated, monkeypatch, capsys) -> None:
    _, text = run_plan(monkeypatch, capsys, "recipe=tiny-verl", "cluster=local", "parallel.rollout_tp=3")
    assert findings(text, "parallel.rollout_tp") == [
        "error: parallel.rollout_tp: 3: vLLM's CPU build runs one engine per training process here (tensor parallel "
        "needs GPUs) Fix: use parallel.rollout_tp=1"]


def test_a_rollout_tp_the_heads_cannot_take_names_only_that_rule(tmp_path: Path) -> None:
    from hpc_grpo.planning.plan import run_plan

    spec = resolve_spec("qwen2.5-7b-codegen", "a100-ib", [f"cluster.runs_root={tmp_path}", "parallel.rollout_tp=8"],
                        run_name="r")
    [err] = [f for f in run_plan(spec, schema=False).findings if f.key == "parallel.rollout_tp"]
    assert err.message == "8: cannot split Qwen2.5-7B-Instruct's 28 attention heads / 4 KV heads evenly"
    assert err.fix == "use parallel.rollout_tp=1 or 2 or 4"
