"""Spec loading: overrides, extends, file:line errors, name rules, the frozen spec round trip."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpc_grpo.launch.render import frozen_spec_text
from hpc_grpo.config.resolve import load_frozen, resolve_spec, split_overrides
from hpc_grpo.common.slurm_time import parse_time_minutes
from hpc_grpo.common.yamlio import SpecError


@pytest.fixture
def lib(isolated: Path, monkeypatch) -> Path:
    (isolated / "lib" / "recipes").mkdir(parents=True)
    (isolated / "lib" / "clusters").mkdir(parents=True)
    monkeypatch.setenv("HPC_GRPO_PATH", str(isolated / "lib"))
    return isolated / "lib"


def test_overrides_are_yaml_typed_and_routed() -> None:
    recipe, cluster, passthrough = split_overrides(
        ["parallel.tp=4", "grpo.kl_loss=false", "logging.logger=[console,wandb]", "cluster.partition=high",
         "trainer.balance_batch=True", "+actor_rollout_ref.x=1", "passthrough.algorithm.foo=bar"])
    assert ("parallel.tp", 4) in recipe and ("grpo.kl_loss", False) in recipe
    assert ("logging.logger", ["console", "wandb"]) in recipe
    assert cluster == [("partition", "high")]
    assert passthrough == {"trainer.balance_batch": True, "+actor_rollout_ref.x": 1, "algorithm.foo": "bar"}


def test_override_changes_the_spec() -> None:
    spec = resolve_spec("qwen2.5-7b-codegen", "a100-ib", ["parallel.tp=4", "resources.nodes=2"], run_name="t")
    assert spec.recipe.parallel.tp == 4 and spec.recipe.resources.nodes == 2
    assert spec.world_size == 16


def test_extends_merges_deeply_and_child_wins(lib: Path) -> None:
    (lib / "recipes" / "child.yaml").write_text("extends: qwen2.5-3b-gsm8k-lora\nname: child\nlora: {rank: 8}\n")
    spec = resolve_spec("child", "a100-ib", run_name="t")
    assert spec.recipe.lora.rank == 8
    assert spec.recipe.lora.alpha == 32  # from the parent
    assert spec.recipe.grpo.lr == 3e-6


def test_error_names_file_and_line(lib: Path) -> None:
    (lib / "recipes" / "typo.yaml").write_text(
        "name: typo\nmodel: {path: Qwen/Qwen2.5-3B-Instruct}\ndata: {train_files: a, val_files: b}\ngrpo:\n  n: 4\n  kll_coef: 1\n")
    with pytest.raises(SpecError) as exc:
        resolve_spec("typo", "a100-ib", run_name="t")
    text = str(exc.value)
    assert "grpo.kll_coef" in text and "typo.yaml:6" in text and "did you mean 'grpo.kl_coef'" in text


def test_malformed_yaml_names_the_line(lib: Path) -> None:
    (lib / "recipes" / "broken.yaml").write_text("name: broken\nmodel:\n  path: [unclosed\n")
    with pytest.raises(SpecError, match=r"broken\.yaml:\d+: malformed YAML"):
        resolve_spec("broken", "local", run_name="t")


def test_frozen_spec_round_trips(isolated: Path) -> None:
    spec = resolve_spec("qwen3-30b-a3b-moe", "h100-roce", ["parallel.etp=1", "lora.rank=8"], run_name="frozen")
    path = isolated / "spec.yaml"
    path.write_text(frozen_spec_text(spec))
    assert load_frozen(path) == spec


def test_paths_expand_home_and_user(isolated: Path) -> None:
    spec = resolve_spec("qwen2.5-3b-gsm8k-lora", "a100-ib", run_name="t")
    assert spec.recipe.data.train_files == str(isolated / "home" / "hpc-grpo-data/gsm8k/verl/train.parquet")
    assert spec.run_dir == "/scratch/user/hpc-grpo-runs/t"
    assert spec.cluster.setup.venv == str(isolated / "home" / "venvs/hpc-grpo")


def test_local_runs_root_is_relative_to_cwd(isolated: Path) -> None:
    spec = resolve_spec("tiny-gsm8k", "local", run_name="t")
    assert spec.run_dir == str(isolated / "runs" / "t")


@pytest.mark.parametrize("text,minutes", [("30", 30), (45, 45), ("01:30:00", 90), ("1-00:00:00", 1440),
                                          ("00:00:30", 1), ("2:05", 3), ("1-12", 2160), ("1-00:30", 1470)])
def test_time_parsing(text, minutes) -> None:
    assert parse_time_minutes(text) == minutes


@pytest.mark.parametrize("text", ["0", "-5", "1:60:00", "abc", "1-2-3", "1:2:3:4", "5:61"])
def test_bad_times(text) -> None:
    with pytest.raises(ValueError):
        parse_time_minutes(text)


def test_unquoted_slurm_times_stay_times(tmp_path: Path) -> None:
    """YAML 1.1 would read `3:00:00` as the base-60 integer 10800 (a 7.5-day limit once taken as minutes)."""
    spec = resolve_spec("tiny-gsm8k", "local", overrides=["resources.time=3:00:00", f"cluster.runs_root={tmp_path}"],
                        run_name="x")
    assert spec.recipe.resources.time == "3:00:00" and parse_time_minutes(spec.recipe.resources.time) == 180
    frozen = tmp_path / "spec.yaml"
    frozen.write_text(frozen_spec_text(spec))
    assert load_frozen(frozen).recipe.resources.time == "3:00:00"
    recipe, _, _ = split_overrides(["resources.time=1:30", "batch.train=1_024"])
    assert ("resources.time", "1:30") in recipe and ("batch.train", 1024) in recipe
