"""engines/verl_dataclasses: verl's config classes read from source with ast, the values a run sets checked
against their fields, and the cache that keeps plan fast."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from hpc_grpo.engines import verl_dataclasses as vd
from hpc_grpo.engines.verl_schema import verl_config_dir

CONFIG_DIR = verl_config_dir()
needs_verl = pytest.mark.skipif(CONFIG_DIR is None, reason="verl's config files are not installed "
                                "(pip install --no-deps verl hydra-core omegaconf)")

FAKE = {
    "verl/__init__.py": "",
    "verl/base.py": "from dataclasses import dataclass\n@dataclass\nclass Base:\n    _mutable = set()\n"
                    "    _target_: str = ''\n",
    "verl/cfg/__init__.py": "from .actor import *\nfrom . import actor\n",
    "verl/cfg/actor.py": (
        "from dataclasses import dataclass, field\nfrom typing import ClassVar, Optional\n"
        "from verl.base import Base\n"
        "@dataclass\nclass Actor(Base):\n    lr: float = 0.1\n    epochs: int = 1\n    tag: Optional[str] = None\n"
        "    hidden: int = field(default=0, init=False)\n    LIMIT: ClassVar[int] = 3\n"
        "@dataclass\nclass FSDPActor(Actor):\n    offload: bool = False\n    sizes: list[int] | None = None\n"),
}


@pytest.fixture()
def fake_verl(tmp_path: Path) -> Path:
    for rel, text in FAKE.items():
        f = tmp_path / rel
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(text)
    return tmp_path / "verl"


def test_fields_follow_star_reexports_and_bases_and_leave_out_classvars_and_init_false(fake_verl: Path) -> None:
    src = vd._Sources(fake_verl)
    found = src.find_class("verl.cfg", "FSDPActor")
    assert found is not None and found[0] == "verl.cfg.actor"
    fields = src.fields(*found)
    assert list(fields) == ["_target_", "lr", "epochs", "tag", "offload", "sizes"]  # base fields first
    assert fields["tag"] == "Optional[str]" and fields["sizes"] == "list[int] | None"
    assert set(src.files) == {"cfg/__init__.py", "cfg/actor.py", "base.py"}  # what the cache hashes


@pytest.mark.parametrize("text, value", [
    ("abc", "abc"), ("0.28", 0.28), ("1e-3", 1e-3), ("3", 3), ("null", None), ("True", True), ("'0.2'", "0.2"),
    ("[q_proj,v_proj]", ["q_proj", "v_proj"]), ("[]", []), ("[[1]]", "[[1]]"),
])
def test_values_read_as_hydra_reads_them(text: str, value: object) -> None:
    assert vd.parse_value(text) == value


@pytest.mark.parametrize("value, annotation, bad", [
    ("abc", "float", True), (1, "float", False), (0.5, "int", True), (True, "int", True), ("true", "bool", True),
    (None, "Optional[int]", False), (None, "int", True), ("x", "int | str", False), (3, "str", False),
    (["a"], "Optional[list[str]]", False), ("a", "list[str]", True), ("a", "SomeConfig", False), (1, "Any", False),
])
def test_types_as_annotated(value: object, annotation: str, bad: bool) -> None:
    assert (vd.type_problem(value, annotation) is not None) is bad


def table() -> vd.Table:
    return vd.Table(
        targets={"actor_rollout_ref.actor": "verl.cfg.FSDPActor", "actor_rollout_ref.ref": "verl.cfg.FSDPActor",
                 "algorithm": "verl.cfg.Algo"},
        classes={"verl.cfg.FSDPActor": {"_target_": "str", "lr": "float", "epochs": "int",
                                        "ppo_micro_batch_size_per_gpu": "Optional[int]",
                                        "override_config": "dict", "use_kl_loss": "bool"},
                 "verl.cfg.Algo": {"gamma": "float"}},
        defaults={k: False for k in vd.REF_SWITCHES})


def keys(findings) -> list[tuple[str, str]]:
    return [(f.severity.value, f.key) for f in findings]


def test_unknown_field_names_the_class_the_key_and_a_close_field() -> None:
    found = vd.check_overrides(["+actor_rollout_ref.actor.lrr=0.1"], table())
    assert keys(found) == [("error", "engine.actor_rollout_ref.actor.lrr")]
    assert "FSDPActor" in found[0].message and "unexpected keyword argument 'lrr'" in found[0].message
    assert "actor_rollout_ref.actor.lr?" in found[0].fix


def test_wrong_type_is_an_error_with_an_example_and_a_right_one_passes() -> None:
    found = vd.check_overrides(["actor_rollout_ref.actor.lr=abc", "actor_rollout_ref.actor.epochs=2"], table())
    assert keys(found) == [("error", "engine.actor_rollout_ref.actor.lr")]
    assert "annotated float" in found[0].message and "actor_rollout_ref.actor.lr=0.2" in found[0].fix


def test_below_a_dict_field_and_outside_converted_nodes_nothing_is_judged() -> None:
    assert vd.check_overrides(["+actor_rollout_ref.actor.override_config.anything=1", "algorithm.gamma=abc",
                               "actor_rollout_ref.actor.lr=${oc.env:LR}"], table()) == []


def test_ref_is_checked_only_with_a_reference_policy_and_after_verls_renames() -> None:
    typo = "+actor_rollout_ref.ref.bogus=1"
    renamed = "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4"
    assert vd.check_overrides([typo], table()) == []  # no KL: verl never converts the ref node
    with_kl = ["actor_rollout_ref.actor.use_kl_loss=True"]
    assert keys(vd.check_overrides([*with_kl, typo, renamed], table())) == [("error", "engine.actor_rollout_ref.ref.bogus")]


@pytest.mark.parametrize("value, warned", [("0", True), ("-1", True), ("1", False)])
def test_ppo_epochs_that_never_update_are_warned(value: str, warned: bool) -> None:
    tbl = vd.Table({"actor_rollout_ref.actor": "A"}, {"A": {"ppo_epochs": "int"}}, {})
    found = vd.check_overrides([f"actor_rollout_ref.actor.ppo_epochs={value}"], tbl)
    assert keys(found) == ([("warning", "engine.actor_rollout_ref.actor.ppo_epochs")] if warned else [])


@needs_verl
def test_the_real_table_knows_verls_actor_and_megatron_classes(isolated) -> None:
    fsdp = vd.table("ppo_trainer", CONFIG_DIR, [])
    actor = fsdp.classes[fsdp.targets["actor_rollout_ref.actor"]]
    assert actor and {"clip_ratio_high", "ppo_epochs", "fsdp_config", "_target_"} <= set(actor)
    assert "megatron" not in actor and actor["clip_ratio"] == "float"
    assert all(fields is not None for fields in fsdp.classes.values()), "a _target_ whose class was not found"
    mcore = vd.table("ppo_megatron_trainer", CONFIG_DIR, [])
    assert "megatron" in mcore.classes[mcore.targets["actor_rollout_ref.actor"]]


@needs_verl
def test_the_cache_is_rebuilt_when_a_class_source_changes(isolated, tmp_path: Path) -> None:
    """The cache holds a hash per source file: an edited verl is re-read (a stale table would wrongly refuse)."""
    root = tmp_path / "site" / "verl"
    shutil.copytree(vd.verl_root(CONFIG_DIR), root, ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    config = root / "trainer" / "config"
    first = vd.table("ppo_trainer", config, [])
    target = first.targets["actor_rollout_ref.actor"]
    assert "brand_new_knob" not in first.classes[target]
    cached = list((isolated / "home" / ".cache" / "hpc-grpo").glob("verl-dataclasses-*.json"))
    assert len(cached) == 1 and "workers/config/actor.py" in json.loads(cached[0].read_text())["files"]
    actor_py = root / "workers" / "config" / "actor.py"
    actor_py.write_text(actor_py.read_text().replace("    ppo_epochs: int = 1\n",
                                                     "    ppo_epochs: int = 1\n    brand_new_knob: int = 0\n"))
    assert vd.table("ppo_trainer", config, []).classes[target]["brand_new_knob"] == "int"


@pytest.mark.parametrize("switches, checked", [([], False), (["algorithm.adv_estimator=gae"], True),
                                               (["critic.enable=True"], True),
                                               (["algorithm.adv_estimator=gae", "critic.enable=False"], False)])
def test_critic_is_checked_only_when_verl_uses_a_critic(switches: list[str], checked: bool) -> None:
    """verl's need_critic: critic.enable when set, else an advantage estimator of gae."""
    tbl = vd.Table({"critic": "verl.cfg.Critic"}, {"verl.cfg.Critic": {"ppo_epochs": "int", "enable": "Optional[bool]"}},
                   {"critic.enable": None, "algorithm.adv_estimator": "grpo"})
    found = vd.check_overrides([*switches, "+critic.ppo_epoch=1"], tbl)
    assert keys(found) == ([("error", "engine.critic.ppo_epoch")] if checked else [])


@needs_verl
def test_the_real_table_knows_verls_critic_class(isolated) -> None:
    fsdp = vd.table("ppo_trainer", CONFIG_DIR, [])
    critic = fsdp.classes[fsdp.targets["critic"]]
    assert critic and "ppo_epochs" in critic and fsdp.defaults["algorithm.adv_estimator"] == "gae"
