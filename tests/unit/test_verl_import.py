"""`hpc-grpo import` turns a verl launch script into a recipe that runs the same verl config.

The property: `plan` on the imported recipe composes (with verl's real Hydra config) to the tree the script
composes to, except for the leaves the import lists as changed, and it lists no leaf that does not differ. Checked on
the scripts in tests/verl_scripts/ (FSDP LoRA GSM8K, Megatron dense, Megatron MoE multi-node with EP, dynamic batch
with sequence balance), written for these tests in verl's launch style.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from hpc_grpo.engines.verl import VerlEngine
from hpc_grpo.engines.verl_import import UNUSABLE, import_script
from hpc_grpo.engines.verl_keymap import resolve_with_verl_keys
from hpc_grpo.engines.verl_schema import composed_leaves
from hpc_grpo.engines.verl_script import parse_script
from tests.conftest import require_verl_yamls

SCRIPTS = Path(__file__).resolve().parents[1] / "verl_scripts"


def _differs(a: dict, b: dict) -> set[str]:
    return {p for p in a.keys() | b.keys() if a.get(p, "<missing>") != b.get(p, "<missing>")}


@pytest.fixture(scope="module")
def imported(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Each script imported once and written where the registry finds it (the test's own HPC_GRPO_PATH)."""
    root = tmp_path_factory.mktemp("lib")
    (root / "recipes").mkdir()
    out = {}
    for script in sorted(SCRIPTS.glob("*.sh")):
        result = import_script(script.read_text(), f"imp-{script.stem.replace('_', '-')}")
        (root / "recipes" / f"{result.name}.yaml").write_text(result.yaml_text(script.name))
        out[script.stem] = result
    return {"root": root, "results": out}


@pytest.mark.parametrize("stem", ["fsdp_lora_gsm8k", "megatron_dense", "megatron_moe_ep", "fsdp_dynamic_bsz"])
def test_plan_on_the_imported_recipe_composes_to_the_script_but_for_what_it_lists(
        stem: str, imported: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = require_verl_yamls()
    result = imported["results"][stem]
    monkeypatch.setenv("HPC_GRPO_PATH", str(imported["root"]))
    spec, _ = resolve_with_verl_keys(result.name, "local", ["cluster.runs_root=/nonexistent/runs"], run_name="p")
    unusable = {r.item.split("=", 1)[0] for r in result.rows if r.went == UNUSABLE}
    script = parse_script((SCRIPTS / f"{stem}.sh").read_text())
    theirs = composed_leaves(result.config_name, [o for o in script.overrides if o.split("=", 1)[0] not in unusable],
                             folder)
    ours = composed_leaves(result.config_name, VerlEngine().command(spec).overrides, folder)
    listed = {r.item for r in result.changed}
    assert _differs(theirs, ours) == listed
    # what the import may change is what hpc-grpo owns: paths in the run directory, its loggers, vLLM's length
    # (and the reference's log-prob micro batch: one recipe key, batch.log_prob_micro_per_gpu, sets the rollout's and
    # the reference's, where a script may set only the rollout's), and Megatron's bridge (hpc-grpo installs mbridge:
    # vanilla_mbridge, and mbridge's own sequence-parallel key)
    owned = ("trainer.default_local_dir", "trainer.logger", "ray_kwargs.ray_init.runtime_env.env_vars.",
             "actor_rollout_ref.rollout.max_model_len", "data.train_files", "data.val_files",
             "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu",
             "actor_rollout_ref.actor.megatron.vanilla_mbridge", "actor_rollout_ref.ref.megatron.vanilla_mbridge",
             "actor_rollout_ref.actor.megatron.override_transformer_config.sequence_parallel",
             "actor_rollout_ref.ref.megatron.override_transformer_config.sequence_parallel")
    assert all(p.startswith(owned) for p in listed), sorted(p for p in listed if not p.startswith(owned))


@pytest.mark.parametrize("stem", ["fsdp_lora_gsm8k", "megatron_dense", "megatron_moe_ep", "fsdp_dynamic_bsz"])
def test_each_imported_recipe_plans_clean_and_renders_on_a_gpu_cluster(stem: str, imported: dict,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Each shape plans with no error on a GPU profile (verl's schema and dataclasses included: the scripts are valid
    verl) and renders; the launch script carries what the script set (its learning rate, in verl's key)."""
    from hpc_grpo.launch.render import render_all
    from hpc_grpo.planning.plan import run_plan
    from hpc_grpo.runstate import layout

    require_verl_yamls()
    result = imported["results"][stem]
    monkeypatch.setenv("HPC_GRPO_PATH", str(imported["root"]))
    spec, _ = resolve_with_verl_keys(result.name, "h100-efa", ["cluster.runs_root=/nonexistent/runs"], run_name="p")
    plan = run_plan(spec)
    assert plan.ok, [f"{f.key}: {f.message}" for f in plan.findings if f.severity.value == "error"]
    assert plan.schema_checked.endswith(": ok"), plan.schema_checked
    launch = render_all(plan.spec)[layout.LAUNCH_SCRIPT]
    script = parse_script((SCRIPTS / f"{stem}.sh").read_text())
    key = "actor_rollout_ref.actor.optim.lr="
    theirs = next(o for o in script.overrides if o.startswith(key))
    ours = next(o for o in VerlEngine().command(plan.spec).overrides if o.startswith(key))
    assert float(ours.removeprefix(key)) == float(theirs.removeprefix(key)), (ours, theirs)
    assert ours in launch, ours


def test_what_each_script_says_lands_in_recipe_keys(imported: dict) -> None:
    require_verl_yamls()
    r = imported["results"]
    lora = r["fsdp_lora_gsm8k"]
    assert lora.recipe["lora.rank"] == 32 and lora.recipe["batch.train"] == 256
    assert lora.spec.recipe.grpo.lr == 3e-6 and "grpo.lr" not in lora.recipe  # the base's value: not repeated
    assert lora.recipe["train.val_before_train"] is True  # the script left verl's default; the base recipe says false
    assert lora.env == {"VLLM_USE_V1": "1", "HYDRA_FULL_ERROR": "1"}
    assert lora.script.unresolved == ["HOME", "EXPERIMENT"]
    moe = r["megatron_moe_ep"]
    assert (moe.backend, moe.recipe["parallel.ep"], moe.recipe["parallel.etp"]) == ("megatron", 8, 1)
    assert moe.spec.recipe.resources.nodes == 4 and moe.spec.gpus_per_node == 8
    dense = r["megatron_dense"]
    assert dense.recipe["model.gradient_checkpointing"] is False  # no recompute in the script: none in the recipe
    assert dense.passthrough["data.return_raw_chat"] is True
    dyn = r["fsdp_dynamic_bsz"]
    assert dyn.recipe["batch.dynamic_bsz"] is True and dyn.recipe["batch.max_token_len_per_gpu"] == 16384
    assert any(row.item == "trainer.resume_mode=auto" and row.went == "dropped" for row in dyn.rows)


def test_secrets_are_never_written(imported: dict) -> None:
    for stem, result in imported["results"].items():
        text = (imported["root"] / "recipes" / f"{result.name}.yaml").read_text()
        for secret in ("not-a-real-key", "hf_not_a_real_token", "abc123notreal", "WANDB_API_KEY=", "HF_TOKEN="):
            assert secret not in text, stem


def test_the_script_reader_expands_quotes_and_says_what_it_could_not() -> None:
    script = parse_script(
        "export A=1\nB=two\nC=\"x y\"\n# python3 -m verl.trainer.main_ppo commented.out=1\n"
        "python3 -m verl.trainer.main_ppo --config-name ppo_megatron_trainer \\\n"
        "  k.a=$A k.b=${B} 'k.c=$B' k.d=\"$C\" k.e=${NOPE:-dflt} k.f=$MISSING \\\n"
        "  k.g='[\"console\",\"wandb\"]' $@\n")
    assert script.config_name == "ppo_megatron_trainer"
    assert script.overrides == ["k.a=1", "k.b=two", "k.c=$B", "k.d=x y", "k.e=dflt", "k.f=$MISSING",
                                'k.g=["console","wandb"]']
    assert script.exports == {"A": "1"} and script.unresolved == ["MISSING"]
    assert any("$@" in n for n in script.notes)


def test_the_import_command_writes_the_recipe_and_refuses_to_overwrite(tmp_path: Path, monkeypatch, capsys) -> None:
    require_verl_yamls()
    from hpc_grpo.cli import app as cli

    target = tmp_path / "recipes" / "mine.yaml"
    monkeypatch.setattr(sys, "argv", ["hpc-grpo", "import", str(SCRIPTS / "fsdp_lora_gsm8k.sh"), "-o", str(target)])
    with pytest.raises(SystemExit) as exc:
        cli.main()
    err = capsys.readouterr().err
    assert exc.value.code == 0, err
    assert "grpo.n=5" in err and "cluster.env.VLLM_USE_V1" in err and "extends: qwen2.5-3b-gsm8k-lora" in target.read_text()
    before = target.read_text()
    with pytest.raises(SystemExit) as exc:
        cli.main()
    assert exc.value.code == 2 and "exists" in capsys.readouterr().err and target.read_text() == before
