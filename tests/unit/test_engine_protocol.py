"""The engine protocol: every shipped engine provides every member of engines.base.Engine and a complete row of
config/engine_traits; code outside engines/ asks the engine (or its traits) instead of comparing engine names, so
an engine registered here with one trait changed changes what that code does. The stand-in engines subclass the
real ones and change one trait or method each; everything else they do is the real engine's."""

from __future__ import annotations

import dataclasses
import inspect
import re
import typing
from pathlib import Path

import pytest

from hpc_grpo import engines
from hpc_grpo.config import engine_traits
from hpc_grpo.config.layout import layout_of
from hpc_grpo.config.engine_traits import ENGINE_NAMES, TRAITS, TRL, VERL, EngineTraits, traits_of
from hpc_grpo.config.resolve import resolve_spec
from hpc_grpo.config.spec import Recipe, RunSpec
from hpc_grpo.engines import get_engine
from hpc_grpo.engines.base import Engine
from hpc_grpo.engines.trl import TrlEngine
from hpc_grpo.engines.verl import VerlEngine
from hpc_grpo.job import prepare_resume as pr
from hpc_grpo.planning import world_size
from hpc_grpo.planning.plan import Plan, defaults_diff
from hpc_grpo.planning.resources import check_resources
from hpc_grpo.runstate import checkpoints as ck
from tests import ckpt_trees as trees

REPO = Path(__file__).resolve().parents[2]
TRL_RECIPE = "tiny-gsm8k"  # trl, one node, no GPU
VERL_FSDP = "qwen2.5-3b-gsm8k-lora"  # verl FSDP on GPUs


def spec_of(recipe: str, tmp_path: Path, cluster: str = "a100-ib", *extra: str) -> RunSpec:
    return resolve_spec(recipe, cluster, overrides=[f"cluster.runs_root={tmp_path}", *extra], run_name="t")


def protocol_members() -> tuple[set[str], set[str]]:
    """(attributes, methods) the Engine protocol declares."""
    attributes = set(typing.get_type_hints(Engine))
    methods = {n for n, v in vars(Engine).items() if callable(v) and not n.startswith("_")}
    return attributes, methods


# ------------------------------------------------------------------------------------------- every engine
def test_the_protocol_carries_more_than_a_command() -> None:
    attributes, methods = protocol_members()
    assert {"name", "launch_template", "traits"} <= attributes
    assert {"command", "check", "job_imports", "resume_overrides", "checkpoint_world_size",
            "lora_targets_unchecked"} <= methods


@pytest.mark.parametrize("name", ENGINE_NAMES)
def test_each_engine_provides_every_member(name: str) -> None:
    engine = get_engine(name)
    attributes, methods = protocol_members()
    for attr in attributes:
        assert getattr(engine, attr, None) is not None, f"{name} lacks {attr}"
    for method in methods:
        ours = getattr(engine, method, None)
        assert callable(ours), f"{name} lacks {method}()"
        want = list(inspect.signature(getattr(Engine, method)).parameters)[1:]
        assert list(inspect.signature(ours).parameters) == want, f"{name}.{method} takes other arguments"
    assert engine.name == name
    assert engine.traits is traits_of(name)


@pytest.mark.parametrize("name", ENGINE_NAMES)
def test_each_engine_has_a_complete_traits_row(name: str) -> None:
    traits = traits_of(name)
    hints = typing.get_type_hints(EngineTraits)
    for f in dataclasses.fields(EngineTraits):
        value = getattr(traits, f.name)
        origin = typing.get_origin(hints[f.name]) or hints[f.name]
        assert isinstance(value, origin), f"{name}.{f.name} = {value!r} is not a {hints[f.name]}"
    assert traits.name == name
    assert traits.checkpoint_format in ("verl", "hf-trainer")
    assert traits.data_columns and all(alts and all(isinstance(c, str) for c in alts) for alts in traits.data_columns)
    assert traits.data_suffix.startswith(".")
    assert traits.hydra_config or traits.no_schema_note, "an engine without a Hydra config says why plan checks none"


def test_one_list_of_engines() -> None:
    """The recipe's `engine` values, the traits table and the engine lookup name the same engines."""
    recipe_engines = typing.get_args(typing.get_type_hints(Recipe)["engine"])
    assert set(recipe_engines) == set(ENGINE_NAMES) == set(engines.FACTORIES) == set(ck.ENGINES) == set(ck.FOLDER_RE)


def test_unknown_engine_is_named_with_the_known_ones() -> None:
    for lookup in (get_engine, traits_of):
        with pytest.raises(ValueError, match=r"unknown engine 'openrlhf': use verl or trl"):
            lookup("openrlhf")


def test_checkpoint_format_picks_the_completeness_rules(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """runstate sits below engines/: it judges a folder by the format in the traits table, not by the engine's name."""
    folder = trees.trl_checkpoint(tmp_path, 2)
    assert ck.judge(folder, "trl").layout == "trl" and ck.judge(folder, "trl").complete
    monkeypatch.setitem(engine_traits.TRAITS, "trl", dataclasses.replace(TRL, checkpoint_format="verl"))
    assert ck.judge(folder, "trl").layout != "trl"


def test_engine_methods(tmp_path: Path) -> None:
    verl, trl = VerlEngine(), TrlEngine()
    assert verl.lora_targets_unchecked(spec_of(VERL_FSDP, tmp_path)) == ""
    assert "Megatron" in verl.lora_targets_unchecked(spec_of("qwen2.5-72b-megatron", tmp_path))
    assert trl.lora_targets_unchecked(spec_of(TRL_RECIPE, tmp_path)) == ""
    fsdp = ck.judge(trees.verl_fsdp(tmp_path / "v", 2, world=4), "verl")
    assert verl.checkpoint_world_size(fsdp) == 4
    whole = ck.judge(trees.trl_checkpoint(tmp_path / "t", 2), "trl")
    assert trl.checkpoint_world_size(whole) is None
    assert trl.resume_overrides(whole.path) == [] and verl.resume_overrides(None) == ["trainer.resume_mode=disable"]


# ------------------------------------------------------------------------- call sites follow the engine
class MultiNodeTrl(TrlEngine):
    traits = dataclasses.replace(TRL, multi_node=True)


def test_resources_ask_the_engine_about_nodes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spec = spec_of(TRL_RECIPE, tmp_path, "a100-ib", "resources.nodes=2")
    refused = [f for f in check_resources(spec, layout_of(spec)) if f.key == "resources.nodes"]
    assert refused and "runs on one node" in refused[0].message and "engine verl" in refused[0].fix
    monkeypatch.setitem(engines.FACTORIES, "trl", MultiNodeTrl)
    assert not [f for f in check_resources(spec, layout_of(spec)) if f.key == "resources.nodes"]


class ShardedTrl(TrlEngine):
    def checkpoint_world_size(self, ckpt: ck.Checkpoint) -> int | None:
        return 8


def test_world_size_rule_is_the_engines(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spec = spec_of(TRL_RECIPE, tmp_path)
    ckpt = ck.judge(trees.trl_checkpoint(spec.path, 2), "trl")
    world_size.check_world_size(spec, ckpt)  # trl saves whole weights: any size loads them
    monkeypatch.setitem(engines.FACTORIES, "trl", ShardedTrl)
    with pytest.raises(world_size.WorldSizeMismatch):
        world_size.check_world_size(spec, ckpt)


class TrackedTrl(TrlEngine):
    traits = dataclasses.replace(TRL, step_tracker=True)

    def resume_overrides(self, step_folder: Path | None) -> list[str]:
        return [f"resume.from={step_folder}"]


def test_resume_preparation_asks_the_engine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    trees.trl_checkpoint(tmp_path, 2)
    real = pr.prepare(tmp_path, "trl")
    assert real.step == 2 and real.overrides == [] and not (tmp_path / "checkpoints" / ck.TRACKER).exists()
    monkeypatch.setitem(engines.FACTORIES, "trl", TrackedTrl)
    faked = pr.prepare(tmp_path, "trl")
    assert faked.overrides == [f"resume.from={real.checkpoint.path}"]  # type: ignore[union-attr]
    assert ck.tracker_step(tmp_path) == 2


class NoHydraVerl(VerlEngine):
    traits = dataclasses.replace(VERL, hydra_config=False, no_schema_note="stand-in: no config here")


def test_defaults_diff_asks_the_engine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spec = spec_of(VERL_FSDP, tmp_path)
    monkeypatch.setitem(engines.FACTORIES, "verl", NoHydraVerl)
    diff, note = defaults_diff(spec, Plan(spec=spec, layout=layout_of(spec), shape=None))
    assert diff is None and note == "not applicable: verl has no verl config (stand-in: no config here)"


def test_lower_layers_read_the_traits_table(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """config/ sits below engines/: RunSpec's CPU mode comes from the table, keyed by the recipe's engine."""
    spec = spec_of(TRL_RECIPE, tmp_path, "local")
    assert spec.gpus_per_node == 0 and not spec.verl_cpu
    monkeypatch.setitem(engine_traits.TRAITS, "trl", dataclasses.replace(TRL, cpu_mode=True))
    assert spec.verl_cpu and spec.procs_key == "resources.cpu_workers_per_node"


# ------------------------------------------------------------------------------ no name branches outside
NAME_BRANCH = re.compile(r"""engine\w*\s*(?:==|!=)\s*['"](?:verl|trl)['"]|['"](?:verl|trl)['"]\s*(?:==|!=)\s*[\w.]*engine"""
                         r"""|engine\w*\s+(?:not\s+)?in\s+\(\s*['"](?:verl|trl)['"]""")


def test_no_engine_name_branch_outside_engines() -> None:
    found = []
    for path in sorted((REPO / "hpc_grpo").rglob("*.py")):
        if "engines" in path.relative_to(REPO / "hpc_grpo").parts:
            continue
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if NAME_BRANCH.search(line):
                found.append(f"{path.relative_to(REPO)}:{n}: {line.strip()}")
    assert not found, "ask get_engine(name).traits (or config/engine_traits) instead:\n" + "\n".join(found)


def test_the_scan_sees_each_spelling() -> None:
    for line in ('if spec.recipe.engine == "verl":', "x if engine != 'trl' else y", 'if "trl" == r.engine:',
                 'if r.engine in ("verl", "trl"):'):
        assert NAME_BRANCH.search(line), line
    assert not NAME_BRANCH.search('get_engine(spec.recipe.engine).traits.multi_node')
    assert set(TRAITS) == {"verl", "trl"}  # the scan spells these two names
