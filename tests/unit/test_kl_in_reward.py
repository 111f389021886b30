"""grpo.kl_in_reward: verl's in-reward KL (algorithm.use_kl_in_reward) with grpo.kl_coef as its fixed coefficient;
the verl name typed on the command line points at the recipe key; both KLs on is a warning; trl refuses it."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpc_grpo.config.layout import layout_of
from hpc_grpo.config.models import resolve_shape
from hpc_grpo.config.resolve import resolve_spec
from hpc_grpo.engines.verl import VerlEngine, config_name, modelled_overrides
from hpc_grpo.engines.verl_memory import check_memory
from hpc_grpo.engines.verl_schema import verl_config_dir
from tests.cli_run import run_plan

RECIPE = "qwen2.5-7b-codegen"  # full fine-tuning: the reference model is a memory term of its own


def spec_with(tmp_path: Path, *extra: str, recipe: str = RECIPE):
    return resolve_spec(recipe, "a100-ib", [f"cluster.runs_root={tmp_path}", *extra], run_name="r")


def rendered(spec) -> dict[str, object]:
    return {o.key: o.value for o in modelled_overrides(spec)}


def test_off_by_default_and_no_controller_rendered(tmp_path: Path) -> None:
    out = rendered(spec_with(tmp_path))
    assert out["algorithm.use_kl_in_reward"] is False
    assert not any(k.startswith("algorithm.kl_ctrl") for k in out)


def test_on_renders_the_flag_and_the_coefficient_from_kl_coef(tmp_path: Path) -> None:
    spec = spec_with(tmp_path, "grpo.kl_in_reward=true", "grpo.kl_loss=false", "grpo.kl_coef=0.02")
    out = rendered(spec)
    assert out["algorithm.use_kl_in_reward"] is True
    assert out["algorithm.kl_ctrl.kl_coef"] == 0.02
    assert out["actor_rollout_ref.actor.use_kl_loss"] is False
    sources = {o.key: o.source for o in modelled_overrides(spec)}
    assert sources["algorithm.use_kl_in_reward"] == "grpo.kl_in_reward"
    assert sources["algorithm.kl_ctrl.kl_coef"] == "grpo.kl_coef"


def test_verl_composes_it_as_a_fixed_controller_of_that_coefficient(tmp_path: Path) -> None:
    """verl's get_kl_controller: type fixed -> beta = kl_ctrl.kl_coef at every step (adaptive would move it)."""
    folder = verl_config_dir()
    if folder is None:
        reason = "verl's config YAMLs are not installed (pip install --no-deps verl hydra-core omegaconf)"
        print(reason)
        pytest.skip(reason)
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    spec = spec_with(tmp_path, "grpo.kl_in_reward=true", "grpo.kl_coef=0.02")
    cmd = VerlEngine().command(spec)
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(folder), version_base=None):
            cfg = compose(config_name=config_name(spec), overrides=cmd.overrides)
    finally:
        GlobalHydra.instance().clear()
    assert cfg.algorithm.use_kl_in_reward is True
    assert cfg.algorithm.kl_ctrl.type == "fixed" and cfg.algorithm.kl_ctrl.kl_coef == 0.02


def test_the_reward_kl_alone_still_counts_the_reference_model(tmp_path: Path) -> None:
    def reference_gib(*extra: str) -> float:
        spec = spec_with(tmp_path, "grpo.kl_loss=false", *extra)
        _, est = check_memory(spec, layout_of(spec), resolve_shape(spec.recipe.model.path))
        return sum(v for k, v in est.terms.items() if "reference" in k)

    assert reference_gib() == 0
    assert reference_gib("grpo.kl_in_reward=true") > 0


def test_the_verl_name_is_the_recipe_key_not_the_kl_loss(isolated: Path, monkeypatch, capsys) -> None:
    """verl's own key means grpo.kl_in_reward (translated, with a line saying so), never grpo.kl_loss; a value that
    contradicts the recipe key typed beside it is refused naming both."""
    code, text = run_plan(monkeypatch, capsys, "recipe=tiny-verl", "algorithm.use_kl_in_reward=True")
    assert "algorithm.use_kl_in_reward=True -> grpo.kl_in_reward=True" in text, text
    assert "error:" not in text, text
    # it took effect: both KLs are now on (tiny-verl keeps the loss's), which plan warns about
    assert "warning: grpo.kl_in_reward: true with grpo.kl_loss=true" in text, text
    code, text = run_plan(monkeypatch, capsys, "recipe=tiny-verl", "algorithm.use_kl_in_reward=True",
                          "grpo.kl_in_reward=false")
    assert code == 2 and "grpo.kl_in_reward" in text and "algorithm.use_kl_in_reward" in text, text


def test_both_kls_on_is_a_warning_naming_the_coefficient(isolated: Path, monkeypatch, capsys) -> None:
    _, text = run_plan(monkeypatch, capsys, "recipe=tiny-verl", "grpo.kl_in_reward=true", "grpo.kl_coef=0.01")
    assert ("warning: grpo.kl_in_reward: true with grpo.kl_loss=true: the KL to the reference is both in the loss and "
            "subtracted from the reward, each weighted grpo.kl_coef=0.01") in text
    _, alone = run_plan(monkeypatch, capsys, "recipe=tiny-verl", "grpo.kl_in_reward=true", "grpo.kl_loss=false")
    assert "grpo.kl_in_reward" not in alone


def test_trl_refuses_it(isolated: Path, monkeypatch, capsys) -> None:
    code, text = run_plan(monkeypatch, capsys, "recipe=tiny-gsm8k", "grpo.kl_in_reward=true")
    assert code == 1
    assert "error: grpo.kl_in_reward: true: trl's GRPO has its KL term in the loss only (beta)" in text
