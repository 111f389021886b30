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
from hpc_grpo.config.resolve import resolve_spec

CONFIG_DIR = verl_config_dir()
pytestmark = pytest.mark.skipif(
    CONFIG_DIR is None, reason="verl's config files are not installed (pip install --no-deps verl hydra-core omegaconf)"
)

# (override, Hydra accepts it): every case is asserted against Hydra's verdict, whichever path plan takes.
MUTATIONS = [
    ("trainer.save_freq=3", True),  # existing key
    ("trainer.sav_freq=3", False),  # typo
    ("+trainer.save_freq=3", False),  # + on an existing key
    ("++trainer.brand_new=1", True),
    ("+trainer.save_freq.deeper=1", True),  # below a value: Hydra makes the value a dict (the cache composes)
    ("actor_rollout_ref.actor=5", True),  # a dict replaced by a scalar: Hydra takes it (verl fails later)
    ("+actor_rollout_ref.actor.megatron.override_transformer_config.moe_router_dtype=fp32", True),
    ("~trainer.save_freq", True),
    # dict values: Hydra merges them and checks their keys in struct mode
    ("actor_rollout_ref.model.override_config={attn_implementation:eager}", False),
    ("+actor_rollout_ref.model.override_config.attn_implementation=eager", True),  # the fix
    ("++actor_rollout_ref.model.override_config={attn_implementation:eager}", True),
    ("trainer={save_freq:3}", True),
    ("trainer={sav_freq:3}", False),
    # list values
    ("trainer.logger=[console,wandb]", True),
    ("+trainer.new_list=[1,2]", True),
    ("actor_rollout_ref.actor.optim=[1]", False),  # a list onto a dict
    ("++actor_rollout_ref.actor.optim=[1]", False),
    # wrong types: verl's YAML is untyped, so Hydra takes them (verl's own checks refuse them later)
    ("trainer.save_freq=abc", True),
    ("trainer.save_freq=[1,2]", True),
    ("trainer.logger=console", True),
]

def base(recipe: str = "qwen2.5-7b-codegen") -> tuple[str, list[str]]:
    cmd = VerlEngine().command(resolve_spec(recipe, "a100-ib", ["cluster.runs_root=/runs"], run_name="t"))
    return cmd.config_name, cmd.overrides


@pytest.mark.parametrize("recipe", ["qwen2.5-7b-codegen", "qwen2.5-3b-gsm8k-lora"])
def test_shipped_recipes_take_the_fast_path_and_hydra_agrees(recipe: str, isolated) -> None:
    name, ov = base(recipe)
    assert accepted_by_tree(ov, key_tree(name, CONFIG_DIR), CONFIG_DIR)
    assert hydra_compose_check(name, ov, CONFIG_DIR) == []


@pytest.mark.parametrize(("extra", "hydra_accepts"), MUTATIONS, ids=[m[0] for m in MUTATIONS])
def test_fast_path_never_accepts_what_hydra_rejects(extra: str, hydra_accepts: bool, isolated) -> None:
    name, ov = base()
    overrides = [*ov, extra]
    hydra = hydra_compose_check(name, overrides, CONFIG_DIR)
    assert (hydra == []) is hydra_accepts, (extra, hydra)
    if not hydra_accepts:
        assert not accepted_by_tree(overrides, key_tree(name, CONFIG_DIR), CONFIG_DIR), extra
    assert compose_check(name, overrides, CONFIG_DIR) == hydra  # plan reports Hydra's verdict, from either path


def test_plan_refuses_a_dict_value_hydra_refuses_and_names_the_fix(isolated) -> None:
    """The override users type for an attention backend: plan said "schema ok", verl's Hydra said no."""
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-m", "hpc_grpo.cli.app", "plan", "recipe=qwen2.5-3b-gsm8k-lora", "cluster=a100-ib",
                           "actor_rollout_ref.model.override_config={attn_implementation:eager}"],
                          capture_output=True, text=True, timeout=300, env={**__import__("os").environ, "COLUMNS": "300"})
    text = " ".join((proc.stdout + proc.stderr).split())
    assert proc.returncode == 1, text
    assert "Key 'attn_implementation' is not in struct" in text, text
    assert "+actor_rollout_ref.model.override_config.attn_implementation=" in text, text


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
             "from hpc_grpo.cli import app as cli\ntry:\n    cli.main()\nexcept SystemExit:\n    pass\n"
             "print('\\nMODULES=' + json.dumps(sorted({m.split('.')[0] for m in sys.modules})))\n")
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "WANDB_MODE": "offline"}
    runs = [subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, timeout=300) for _ in (1, 2)]
    mods = [set(json.loads(r.stdout.rsplit("MODULES=", 1)[1])) for r in runs]
    assert "hydra" in mods[0]  # cold: composed once and cached under $HOME/.cache/hpc-grpo
    assert "hydra" not in mods[1] and "omegaconf" not in mods[1], runs[1].stdout[-500:]
    assert '"schema": "composed against verl' in runs[1].stdout
    assert list((tmp_path / ".cache" / "hpc-grpo").glob("verl-keys-*-ppo_trainer-*.json"))
