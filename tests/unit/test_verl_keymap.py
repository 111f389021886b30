"""verl's own names for the keys hpc-grpo models are translated, checked or passed through.

The inverse map (engines.verl_keymap) is derived from modelled_overrides; these tests hold it to its promise: a
translated verl key renders exactly what its recipe key renders, for every key the map holds, with a value other
than the recipe's.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from hpc_grpo.common.yamlio import SpecError
from hpc_grpo.config.resolve import resolve_spec
from hpc_grpo.engines.verl import VerlEngine
from hpc_grpo.engines.verl_keymap import (
    _other_value,
    inverse_map,
    resolve_with_verl_keys,
)
from hpc_grpo.config.verl_keys import format_value
from tests.conftest import require_verl_yamls

ROOT = "cluster.runs_root=/nonexistent/runs"
CASES = [("qwen2.5-3b-gsm8k-lora", "a100-ib"), ("qwen2.5-72b-megatron", "a100-ib"), ("tiny-verl", "local")]


def rendered(spec) -> list[str]:
    return VerlEngine().command(spec).overrides


def resolve(recipe: str, cluster: str, *ov: str):
    return resolve_with_verl_keys(recipe, cluster, [ROOT, *ov], run_name="t", now=0.0)


def test_the_map_holds_plain_copies_and_not_what_hpc_grpo_derives() -> None:
    fsdp = inverse_map(resolve_spec("qwen2.5-3b-gsm8k-lora", "a100-ib", [ROOT]))
    assert fsdp["actor_rollout_ref.rollout.n"] == "grpo.n"
    assert fsdp["actor_rollout_ref.model.lora_rank"] == "lora.rank"
    assert fsdp["data.train_batch_size"] == "batch.train"
    for derived in ("trainer.nnodes", "trainer.n_gpus_per_node",  # placement: resources and the profile decide
                    "actor_rollout_ref.rollout.max_model_len",  # prompt + response
                    "trainer.logger",  # the recipe's loggers plus 'file'
                    "algorithm.adv_estimator", "trainer.default_local_dir"):
        assert derived not in fsdp
    mega = inverse_map(resolve_spec("qwen2.5-72b-megatron", "a100-ib", [ROOT]))
    assert mega["actor_rollout_ref.ref.megatron.tensor_model_parallel_size"] == "parallel.tp"
    assert "actor_rollout_ref.actor.fsdp_config.param_offload" not in mega
    cpu = inverse_map(resolve_spec("tiny-verl", "local", [ROOT]))
    assert "actor_rollout_ref.model.use_remove_padding" not in cpu  # verl's CPU mode decides it there


@pytest.mark.parametrize("recipe,cluster", CASES)
def test_every_translated_key_renders_what_its_recipe_key_renders(recipe: str, cluster: str) -> None:
    base = resolve_spec(recipe, cluster, [ROOT], run_name="t", now=0.0)
    checked = 0
    for verl_key, field in inverse_map(base).items():
        owner: object = base.recipe
        *parents, last = field.split(".")
        for part in parents:
            owner = getattr(owner, part)
        value = _other_value(getattr(owner, last), type(owner).model_fields[last].annotation, True)
        if isinstance(value, bool):
            value = not getattr(owner, last)
        typed = format_value(value)
        try:
            want = rendered(resolve_spec(recipe, cluster, [ROOT, f"{field}={typed}"], run_name="t", now=0.0))
        except SpecError as exc:  # a value the recipe key refuses is refused the same through verl's name
            with pytest.raises(SpecError) as got:
                resolve(recipe, cluster, f"{verl_key}={typed}")
            assert str(got.value) == str(exc)
            continue
        spec, notes = resolve(recipe, cluster, f"{verl_key}={typed}")
        assert rendered(spec) == want, verl_key
        # data.max_prompt_length and friends: verl's name is the recipe key's, nothing to say
        assert notes == ([] if verl_key == field else [f"{verl_key}={typed} -> {field}={typed}"]), verl_key
        checked += 1
    assert checked >= 25  # most values are accepted: the property is not carried by refusals


def test_equal_owned_keys_are_dropped_and_other_values_refused_with_the_setting_that_decides() -> None:
    spec, notes = resolve("qwen2.5-3b-gsm8k-lora", "a100-ib", "algorithm.adv_estimator=grpo", "trainer.nnodes=1",
                          "trainer.critic_warmup=0", "trainer.n_gpus_per_node=4")
    assert not spec.recipe.passthrough
    assert len(notes) == 4 and all("hpc-grpo sets the same; dropped" in n for n in notes)
    with pytest.raises(SpecError) as exc:
        resolve("qwen2.5-3b-gsm8k-lora", "a100-ib", "trainer.critic_warmup=2", "trainer.resume_mode=auto",
                "actor_rollout_ref.rollout.max_model_len=100")
    text = str(exc.value)
    assert "hpc-grpo sets trainer.critic_warmup=0 for every GRPO run; no recipe key changes it" in text
    assert "`hpc-grpo resume RUN`" in text
    assert "max_model_len=1536 from recipe key data.max_response_length" in text
    assert "instead" not in text  # no "set X instead" where X is not a key


def test_a_verl_key_agreeing_with_its_recipe_key_is_accepted() -> None:
    spec, notes = resolve("qwen2.5-3b-gsm8k-lora", "a100-ib", "actor_rollout_ref.rollout.n=8", "grpo.n=8")
    assert spec.recipe.grpo.n == 8 and not spec.recipe.passthrough
    assert notes == ["actor_rollout_ref.rollout.n=8 -> grpo.n=8"]


def test_verl_data_keys_pass_through_and_recipe_data_keys_stay_recipe_keys() -> None:
    spec, notes = resolve("qwen2.5-3b-gsm8k-lora", "a100-ib", "data.return_raw_chat=True", "++data.prompt_key=question",
                          "data.max_prompt_length=256")
    assert spec.recipe.passthrough == {"data.return_raw_chat": True, "++data.prompt_key": "question"}
    assert spec.recipe.data.max_prompt_length == 256 and notes == []
    assert {"data.return_raw_chat=True", "++data.prompt_key=question"} <= set(rendered(spec))


def test_a_recipe_passthrough_block_is_translated_and_a_contradiction_in_the_file_refused(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    lib = tmp_path / "recipes"
    lib.mkdir()
    (lib / "mine.yaml").write_text("extends: qwen2.5-3b-gsm8k-lora\nname: mine\npassthrough:\n"
                                   "  actor_rollout_ref.actor.optim.lr: 1.0e-5\n  trainer.critic_warmup: 0\n")
    (lib / "both.yaml").write_text("extends: qwen2.5-3b-gsm8k-lora\nname: both\ngrpo: {n: 4}\npassthrough:\n"
                                   "  actor_rollout_ref.rollout.n: 6\n")
    monkeypatch.setenv("HPC_GRPO_PATH", str(tmp_path))
    spec, notes = resolve("mine", "a100-ib")
    assert spec.recipe.grpo.lr == 1e-5 and not spec.recipe.passthrough
    assert notes[0].startswith("actor_rollout_ref.actor.optim.lr=1e-05 -> grpo.lr=1e-05 (passthrough at ")
    with pytest.raises(SpecError, match=r"passthrough.actor_rollout_ref.rollout.n=6 \(.*both.yaml:\d+\) contradicts "
                                        r"grpo.n=4 \(.*both.yaml:\d+\)"):
        resolve("both", "a100-ib")


def test_hydra_accepts_the_data_key_forms_it_suggests() -> None:
    from hpc_grpo.engines.verl_schema import hydra_compose_check

    folder = require_verl_yamls()
    refused = hydra_compose_check("ppo_trainer", ["+data.return_raw_chat=True"], folder)
    assert refused and "drop the '+'" in refused[0].fix
    assert hydra_compose_check("ppo_trainer", ["data.return_raw_chat=True", "++data.prompt_key=q"], folder) == []
