"""The cached key tree of verl's config (plan's fast schema path) against Hydra's real compose, side by side:
it may only accept what Hydra accepts, and the findings plan reports are Hydra's own either way."""

from __future__ import annotations

import shutil

import pytest

from hpc_grpo.engines.verl import VerlEngine
from hpc_grpo.engines.verl_schema import (
    _cache_file,
    accepted_by_tree,
    compose_check,
    hydra_compose_check,
    key_tree,
    verl_config_dir,
)
from hpc_grpo.resolve import resolve_spec

CONFIG_DIR = verl_config_dir()
pytestmark = pytest.mark.skipif(
    CONFIG_DIR is None, reason="verl's config files are not installed (pip install --no-deps verl hydra-core omegaconf)"
)

MUTATIONS = [
    "trainer.save_freq=3",  # existing key
    "trainer.sav_freq=3",  # typo
    "+trainer.save_freq=3",  # + on an existing key
    "++trainer.brand_new=1",
    "+trainer.save_freq.deeper=1",  # below a value
    "actor_rollout_ref.actor=5",  # a dict replaced by a scalar
    "+actor_rollout_ref.actor.megatron.override_transformer_config.moe_router_dtype=fp32",
    "~trainer.save_freq",
]


def base(recipe: str = "qwen2.5-7b-codegen") -> tuple[str, list[str]]:
    cmd = VerlEngine().command(resolve_spec(recipe, "a100-ib", ["cluster.runs_root=/runs"], run_name="t"))
    return cmd.config_name, cmd.overrides


@pytest.mark.parametrize("recipe", ["qwen2.5-7b-codegen", "qwen2.5-3b-gsm8k-lora"])
def test_shipped_recipes_take_the_fast_path_and_hydra_agrees(recipe: str, isolated) -> None:
    name, ov = base(recipe)
    assert accepted_by_tree(ov, key_tree(name, CONFIG_DIR), CONFIG_DIR)
    assert hydra_compose_check(name, ov, CONFIG_DIR) == []


@pytest.mark.parametrize("extra", MUTATIONS)
def test_fast_path_never_accepts_what_hydra_rejects(extra: str, isolated) -> None:
    name, ov = base()
    overrides = [*ov, extra]
    hydra = hydra_compose_check(name, overrides, CONFIG_DIR)
    if accepted_by_tree(overrides, key_tree(name, CONFIG_DIR), CONFIG_DIR):
        assert hydra == [], (extra, hydra)
        assert compose_check(name, overrides, CONFIG_DIR) == []
    # otherwise compose_check returns hydra_compose_check's findings: Hydra's own messages


def test_the_cache_key_follows_verl_version_and_yaml_content(isolated, tmp_path) -> None:
    copy = tmp_path / "config"
    shutil.copytree(CONFIG_DIR, copy)
    first = _cache_file("ppo_trainer", copy)
    tree = key_tree("ppo_trainer", copy)
    assert first.is_file() and "trainer.save_freq" in tree and str(isolated / "home") in str(first)
    yaml = copy / "ppo_trainer.yaml"
    yaml.write_text(yaml.read_text() + "\nbrand_new_section:\n  knob: 1\n")
    second = _cache_file("ppo_trainer", copy)
    assert second != first
    assert key_tree("ppo_trainer", copy)["brand_new_section.knob"] == "value"


def test_plan_with_a_warm_cache_imports_no_hydra(tmp_path) -> None:
    import json
    import subprocess
    import sys

    probe = ("import json, sys\nsys.argv = ['hpc-grpo', 'plan', 'recipe=qwen2.5-3b-gsm8k-lora', 'cluster=a100-ib', '--json']\n"
             "from hpc_grpo import cli\ntry:\n    cli.main()\nexcept SystemExit:\n    pass\n"
             "print('\\nMODULES=' + json.dumps(sorted({m.split('.')[0] for m in sys.modules})))\n")
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "WANDB_MODE": "offline"}
    runs = [subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, timeout=300) for _ in (1, 2)]
    mods = [set(json.loads(r.stdout.rsplit("MODULES=", 1)[1])) for r in runs]
    assert "hydra" in mods[0]  # cold: composed once and cached under $HOME/.cache/hpc-grpo
    assert "hydra" not in mods[1] and "omegaconf" not in mods[1], runs[1].stdout[-500:]
    assert '"schema": "composed against verl' in runs[1].stdout
    assert list((tmp_path / ".cache" / "hpc-grpo").glob("verl-keys-*-ppo_trainer-*.json"))
