"""Total steps, checkpoint steps and sizes, and the warnings for runs that would lose
everything to a time limit or a crash (the pinned verl saves at multiples of save_freq and at the last step)."""

from __future__ import annotations

import json
import sys

import pytest

from hpc_grpo.config import registry
from hpc_grpo.planning.ckpt_size import checkpoint_size
from hpc_grpo.common.findings import Severity
from hpc_grpo.config.models import resolve_shape
from hpc_grpo.planning.plan import run_plan
from hpc_grpo.config.resolve import resolve_spec
from hpc_grpo.config.steps import dataset_rows
from hpc_grpo.planning.schedule import checkpoint_steps, estimate_step_s

RECIPES = registry.list_names("recipes")
CLUSTERS = registry.list_names("clusters")


def plan_of(recipe: str, *ov: str, cluster: str = "a100-ib"):
    return run_plan(resolve_spec(recipe, cluster, ["cluster.runs_root=/nonexistent/runs", *ov], run_name="t"), schema=False)


def warnings_of(plan, key: str = "checkpoint.save_freq") -> list:
    return [f for f in plan.findings if f.severity is Severity.WARNING and f.key == key]


def test_verl_checkpoint_rule() -> None:
    assert checkpoint_steps(35, 50) == [35]
    assert checkpoint_steps(35, 7) == [7, 14, 21, 28, 35]
    assert checkpoint_steps(58, 25) == [25, 50, 58]
    assert checkpoint_steps(10, 0) == []


def test_3b_lora_recipe_schedule_and_the_old_save_freq_warning(isolated) -> None:
    # isolated HOME: the recipe's ~/hpc-grpo-data files are absent, so the row count comes from the table
    s = plan_of("qwen2.5-3b-gsm8k-lora").schedule
    assert (s.rows, s.steps_per_epoch, s.total_steps) == (7473, 7, 35)  # 7473 // 1024 = 7 x 5 epochs
    assert "known data set table" in s.rows_source
    assert s.checkpoint_steps == [7, 14, 21, 28, 35]
    old = plan_of("qwen2.5-3b-gsm8k-lora", "checkpoint.save_freq=50")
    assert old.schedule.checkpoint_steps == [35]
    w = warnings_of(old)
    assert w and "only checkpoint is the last step's" in w[0].message and "save_freq=7" in w[0].fix


def test_moe_and_72b_schedules() -> None:
    moe = plan_of("qwen3-30b-a3b-moe").schedule
    assert moe.total_steps == 58 and moe.checkpoint_steps == [29, 58]
    big = plan_of("qwen2.5-72b-megatron").schedule
    assert big.total_steps == 58 and big.checkpoint_steps == [25, 50, 58]
    assert 0.95e12 < big.size.total_bytes < 1.15e12  # ~1 TB per checkpoint
    assert "TB" in big.size.describe()


def test_first_time_limit_before_the_first_checkpoint_warns() -> None:
    p = plan_of("qwen2.5-72b-megatron", "resources.time=01:00:00")
    w = [f for f in warnings_of(p) if "first time limit" in f.message]
    assert w and "step 25" in w[0].message
    advised = int(w[0].fix.split("save_freq=")[1].split()[0])
    assert 1 <= advised <= p.schedule.steps_in_time_limit
    assert not [f for f in warnings_of(plan_of("qwen2.5-72b-megatron")) if "first time limit" in f.message]


def test_step_time_is_calibrated_on_field_report_004() -> None:
    spec = resolve_spec("qwen2.5-3b-gsm8k-lora", "a100-ib", run_name="t")
    shape = resolve_shape(spec.recipe.model.path)
    t5 = estimate_step_s(spec, shape)
    assert t5 == pytest.approx(6 * 3600 / 105, rel=0.02)  # the tuned run: 6 h for 105 steps
    t10 = estimate_step_s(resolve_spec("qwen2.5-3b-gsm8k-lora", "a100-ib", ["grpo.n=10"], run_name="t"), shape)
    assert t10 / t5 == pytest.approx(11 / 6.5, rel=0.02)  # n=10 took 11 h where n=5 took 6.5 h


def test_rows_from_parquet_footer_and_jsonl(tmp_path) -> None:
    pa = pytest.importorskip("pyarrow", reason="pyarrow is in the local extra; without it plan uses the known table")
    import pyarrow.parquet as pq

    f = tmp_path / "gsm8k" / "train.parquet"
    f.parent.mkdir()
    pq.write_table(pa.table({"x": list(range(300))}), f)
    assert dataset_rows(str(f)) == (300, f"parquet footer of {f}")
    j = tmp_path / "train.jsonl"
    j.write_text("".join(json.dumps({"i": i}) + "\n" for i in range(50)) + "\n")
    assert dataset_rows(str(j))[0] == 50
    assert dataset_rows(str(tmp_path / "nope" / "train.parquet"))[0] is None
    plan = plan_of("qwen2.5-3b-gsm8k-lora", f"data.train_files={f}", "batch.train=100", "batch.mini=50")
    assert plan.schedule.total_steps == 15 and "parquet footer" in plan.schedule.rows_source


def test_checkpoint_sizes() -> None:
    p = 7.6e9
    assert checkpoint_size("verl", "fsdp", p).total_bytes == pytest.approx(12 * p * 1.02)  # fp32 params + Adam
    lora = checkpoint_size("verl", "fsdp", 3.09e9, 1.2e8)
    assert lora.weights_bytes == pytest.approx(4 * (3.09e9 + 1.2e8))  # the shards keep the fp32 base
    assert lora.gib > 2 * 3.09e9 * 2 / 2**30 * 1.05  # more than twice the old bf16 "adapter only" estimate
    assert checkpoint_size("verl", "megatron", p).total_bytes == pytest.approx(14 * p * 1.02)


@pytest.mark.parametrize("recipe", RECIPES)
def test_no_shipped_recipe_writes_zero_checkpoints_before_its_end(recipe: str) -> None:
    s = plan_of(recipe).schedule
    assert s.total_steps, s.rows_source
    before_end = [c for c in s.checkpoint_steps if c < s.total_steps]
    assert before_end or s.total_steps == 1, (recipe, s.checkpoint_steps, s.total_steps)
    assert not warnings_of(plan_of(recipe))


@pytest.mark.parametrize("cluster", CLUSTERS)
def test_plan_prints_the_schedule_on_every_recipe(cluster: str, isolated, monkeypatch, capsys) -> None:
    from hpc_grpo.cli import app as cli

    for recipe in RECIPES:
        monkeypatch.setattr(sys, "argv", ["hpc-grpo", "plan", f"recipe={recipe}", f"cluster={cluster}",
                                          "cluster.runs_root=/nonexistent/runs", "--no-schema"])
        with pytest.raises(SystemExit) as exc:
            cli.main()
        text = capsys.readouterr().out
        assert exc.value.code in (0, 1), text
        sched = [ln for ln in text.splitlines() if ln.startswith("Schedule: ")]
        assert sched and " steps" in sched[0] and "unknown" not in sched[0], (recipe, cluster, text)
        ckpt = [ln for ln in text.splitlines() if ln.strip().startswith("checkpoints (save_freq")]
        assert ckpt and "at steps " in ckpt[0], (recipe, cluster)
        # sizes need the model's shape: the built-in table for Hub models; the tiny model only once it is built
        assert "GiB" in ckpt[0] or (recipe.startswith("tiny-") and "size unknown" in ckpt[0]), (recipe, cluster, ckpt)
