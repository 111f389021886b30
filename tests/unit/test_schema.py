"""Rendered overrides against verl's real Hydra config (verl installed with --no-deps in the test venv)."""

from __future__ import annotations

import pytest

from hpc_grpo.config import registry
from hpc_grpo.engines.verl import VerlEngine
from hpc_grpo.engines.verl_schema import compose_check, verl_config_dir
from hpc_grpo.planning.plan import run_plan
from hpc_grpo.config.resolve import resolve_spec

CONFIG_DIR = verl_config_dir()
needs_verl = pytest.mark.skipif(
    CONFIG_DIR is None, reason="verl's config files are not installed (pip install --no-deps verl hydra-core omegaconf)"
)
VERL_RECIPES = [n for n in registry.list_names("recipes") if resolve_spec(n, "a100-ib", run_name="t").recipe.engine == "verl"]


@needs_verl
@pytest.mark.parametrize("recipe", VERL_RECIPES)
def test_every_verl_recipe_composes(recipe: str) -> None:
    spec = resolve_spec(recipe, "a100-ib", ["cluster.runs_root=/runs"], run_name="t")
    cmd = VerlEngine().command(spec)
    assert compose_check(cmd.config_name, cmd.overrides, CONFIG_DIR) == []


@needs_verl
def test_lora_megatron_form_composes() -> None:
    spec = resolve_spec("qwen2.5-7b-codegen", "a100-ib", ["lora.rank=16", "lora.target_modules=[linear_qkv,linear_proj]"],
                        run_name="t")
    cmd = VerlEngine().command(spec)
    assert any(o.startswith("actor_rollout_ref.model.lora.rank=16") for o in cmd.overrides)
    assert compose_check(cmd.config_name, cmd.overrides, CONFIG_DIR) == []


@needs_verl
def test_wrong_keys_are_rejected_each_by_name() -> None:
    spec = resolve_spec("qwen2.5-3b-gsm8k-lora", "a100-ib",
                        ["actor_rollout_ref.actor.ppo_mini_bach_size=3", "trainer.sav_freq=2"], run_name="t")
    plan = run_plan(spec, schema=True)
    keys = {f.key for f in plan.findings}
    assert "engine.actor_rollout_ref.actor.ppo_mini_bach_size" in keys
    assert "engine.trainer.sav_freq" in keys
    assert not plan.ok and "rejected" in plan.schema_checked


@needs_verl
def test_plus_on_existing_key_is_rejected() -> None:
    found = compose_check("ppo_trainer", ["+trainer.save_freq=3"], CONFIG_DIR)
    assert found and "++trainer.save_freq" in found[0].fix


def test_without_verl_the_plan_says_the_schema_check_was_skipped(monkeypatch) -> None:
    import hpc_grpo.engines.verl_schema as vs

    monkeypatch.setattr(vs, "verl_config_dir", lambda: None)
    plan = run_plan(resolve_spec("qwen2.5-3b-gsm8k-lora", "a100-ib", run_name="t"), schema=True)
    assert plan.schema_checked.startswith("skipped")
    assert plan.ok
