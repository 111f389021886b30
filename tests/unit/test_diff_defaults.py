"""plan --diff-defaults: every verl key a run sets away from verl's own defaults (two real Hydra composes of verl's
installed YAMLs), with interpolated defaults resolved, and for each what set it: a recipe key (recipe file, command
line or hpc-grpo's default), the cluster profile, a passthrough key, hpc-grpo's engine or CPU mode, or an
interpolation of verl's that follows another key. Printed and in --json."""

from __future__ import annotations

import json
from pathlib import Path

from hpc_grpo.config.resolve import resolve_spec
from hpc_grpo.engines.verl_defaults import ABSENT, MISSING, Difference, diff_defaults
from hpc_grpo.config.verl_keys import VERL_VERSION
from tests.cli_run import run_plan


def diff_of(tmp_path: Path, folder: Path, recipe: str, cluster: str, *extra: str) -> dict[str, Difference]:
    spec = resolve_spec(recipe, cluster, [f"cluster.runs_root={tmp_path}", *extra], run_name="r")
    return {d.key: d for d in diff_defaults(spec, folder)}


def test_the_recipe_changes_verl_left_at_defaults_are_listed_with_their_recipe_key(verl_yamls, tmp_path) -> None:
    d = diff_of(tmp_path, verl_yamls, "qwen2.5-3b-gsm8k-lora", "a100-ib", "batch.train=512",
                "actor_rollout_ref.actor.clip_ratio_high=0.28")
    # silent changes a user would not see, each with what set it and where that came from
    assert (d["trainer.val_before_train"].default, d["trainer.val_before_train"].value) == (True, False)
    assert d["trainer.val_before_train"].why == "recipe key train.val_before_train (hpc-grpo's default)"
    assert (d["actor_rollout_ref.rollout.load_format"].default, d["actor_rollout_ref.rollout.load_format"].value) == \
        ("dummy", "safetensors")
    assert d["actor_rollout_ref.rollout.layered_summon"].why == "recipe key rollout.layered_summon (recipe file)"
    assert d["data.filter_overlong_prompts"].value is True
    assert d["actor_rollout_ref.ref.fsdp_config.param_offload"].why == "recipe key offload.ref_param (recipe file)"
    assert d["data.train_batch_size"].why == "recipe key batch.train (command line: batch.train=512)"
    assert d["actor_rollout_ref.actor.clip_ratio_high"].why == \
        "passthrough (command line: actor_rollout_ref.actor.clip_ratio_high=0.28)"
    assert d["algorithm.adv_estimator"].why == "hpc-grpo engine"
    assert d["trainer.default_local_dir"].why == "hpc-grpo (the run directory)"
    # verl's ??? and interpolated defaults, resolved
    assert d["actor_rollout_ref.rollout.name"].default == MISSING
    resp = d["actor_rollout_ref.rollout.response_length"]
    assert (resp.default, resp.value) == (512, 1024)
    assert resp.interpolation == "${oc.select:data.max_response_length,512}"
    assert resp.why.startswith("verl's interpolation ${oc.select:data.max_response_length,512}")
    assert d["ray_kwargs.ray_init.runtime_env.env_vars.WANDB_RESUME"].default == ABSENT
    # a key the recipe renders at verl's own value is not a difference
    assert "algorithm.norm_adv_by_std_in_grpo" not in d and "algorithm.use_kl_in_reward" not in d


def test_cpu_mode_and_a_section_that_follows_another_are_named(verl_yamls, tmp_path) -> None:
    cpu = diff_of(tmp_path, verl_yamls, "tiny-verl", "local")
    assert cpu["trainer.device"].value == "cpu"
    assert cpu["trainer.device"].why == "hpc-grpo CPU mode (verl CPU mode (no GPU given))"
    mega = diff_of(tmp_path, verl_yamls, "qwen2.5-7b-codegen", "a100-ib")
    ref = mega["actor_rollout_ref.ref.megatron.override_transformer_config.recompute_granularity"]
    assert ref.value == "full" and "its section actor_rollout_ref.ref.megatron.override_transformer_config" in ref.why
    actor = mega["actor_rollout_ref.actor.megatron.override_transformer_config.recompute_granularity"]
    assert actor.why == "recipe key model.gradient_checkpointing (hpc-grpo's default)"
    assert mega["actor_rollout_ref.actor.use_dynamic_bsz"].why == "recipe key batch.dynamic_bsz (recipe file)"


def test_the_cluster_profile_is_named_where_the_recipe_leaves_gpus_to_it(verl_yamls, isolated, monkeypatch,
                                                                         capsys) -> None:
    lib = isolated / "lib" / "recipes"
    lib.mkdir(parents=True)
    (lib / "mine.yaml").write_text("name: mine\nengine: verl\nmodel: {path: Qwen/Qwen2.5-3B-Instruct}\n"
                                   "data: {train_files: /d/train.parquet, val_files: /d/test.parquet}\n")
    monkeypatch.setenv("HPC_GRPO_PATH", str(isolated / "lib"))
    _, text = run_plan(monkeypatch, capsys, "recipe=mine", "cluster=h100-efa", "--diff-defaults")
    assert "trainer.n_gpus_per_node  |" not in text  # verl's 8 = the profile's 8: no difference
    _, text = run_plan(monkeypatch, capsys, "recipe=mine", "cluster=slurm-dev", "--diff-defaults")
    assert "  trainer.n_gpus_per_node  |  8  |  4  |  cluster profile slurm-dev (gpus_per_node 4)" in text
    _, text = run_plan(monkeypatch, capsys, "recipe=mine", "cluster=h100-efa", "--diff-defaults", "cluster.gpus_per_node=2")
    assert ("  trainer.n_gpus_per_node  |  8  |  2  |  cluster profile h100-efa (command line: cluster.gpus_per_node=2)"
            in text)


def test_printed_lines_and_json(verl_yamls, isolated, monkeypatch, capsys) -> None:
    _, text = run_plan(monkeypatch, capsys, "recipe=tiny-verl", "--diff-defaults")
    assert "verl defaults this run changes (" in text
    assert ("  actor_rollout_ref.rollout.response_length  |  512 (= ${oc.select:data.max_response_length,512})  |  16"
            "  |  verl's interpolation") in text
    assert "  actor_rollout_ref.rollout.name  |  ???  |  vllm  |  recipe key rollout.name (recipe file)" in text
    _, out = run_plan(monkeypatch, capsys, "recipe=tiny-verl", "--diff-defaults", "--json", stdout_only=True)
    got = json.loads(out)["diff_defaults"]
    keys = {d["key"]: d for d in got["keys"]}
    assert keys["trainer.device"] == {"key": "trainer.device", "default": "cuda", "value": "cpu",
                                      "why": "hpc-grpo CPU mode (verl CPU mode (no GPU given))", "interpolation": None}
    assert got["note"] == f"{len(got['keys'])} verl keys differ from verl {VERL_VERSION}'s defaults"
    _, plain = run_plan(monkeypatch, capsys, "recipe=tiny-verl", "--json", stdout_only=True)
    assert "diff_defaults" not in json.loads(plain)  # only when asked: it costs two Hydra composes


def test_not_computed_where_verl_rejects_the_overrides_and_not_for_trl(verl_yamls, isolated, monkeypatch,
                                                                       capsys) -> None:
    _, text = run_plan(monkeypatch, capsys, "recipe=tiny-verl", "--diff-defaults", "trainer.no_such_key=1")
    assert "verl defaults: not computed: verl's config rejects this run's overrides (see the errors below)" in text
    _, text = run_plan(monkeypatch, capsys, "recipe=tiny-gsm8k", "--diff-defaults")
    assert "verl defaults: not applicable: trl has no verl config" in text
