"""What plan predicts a run costs (planning.cost): GPU-hours from the steps, the step-time model and the GPUs, the
eval job's upper bound, checkpoint disk, the calibration named beside the figure, and --budget-gpu-hours."""

from __future__ import annotations

import pytest

from hpc_grpo.common.yamlio import SpecError
from hpc_grpo.config.resolve import resolve_spec
from hpc_grpo.planning.cost import CALIBRATION, check_budget, run_cost
from hpc_grpo.planning.schedule import STARTUP_S, make_schedule
from hpc_grpo.config.models import resolve_shape


def cost_of(recipe: str, cluster: str, *overrides: str):
    spec = resolve_spec(recipe, cluster, list(overrides))
    return run_cost(spec, make_schedule(spec, resolve_shape(spec.recipe.model.path)))


def test_gpu_hours_are_steps_times_step_time_times_gpus_plus_the_eval_bound() -> None:
    c = cost_of("qwen2.5-3b-gsm8k-lora", "a100-ib", "train.total_training_steps=100")
    assert c.steps == 100 and c.gpus == 4 and c.step_s is not None
    assert c.wall_s == pytest.approx(STARTUP_S + 100 * c.step_s)
    assert c.train_gpu_hours == pytest.approx(c.wall_s * 4 / 3600)
    assert c.gpu_hours == pytest.approx(c.train_gpu_hours + c.eval_gpus * c.eval_limit_s / 3600)
    assert c.source == CALIBRATION  # calibrated on A100s: no caveat
    longer = cost_of("qwen2.5-3b-gsm8k-lora", "a100-ib", "train.total_training_steps=200")
    assert longer.train_gpu_hours == pytest.approx((STARTUP_S + 200 * c.step_s) * 4 / 3600)
    assert c.ckpts_kept <= c.ckpts_written and c.disk_peak_gib == pytest.approx(c.ckpt_gib * c.ckpts_kept)


def test_other_hardware_is_said_beside_the_figure() -> None:
    c = cost_of("qwen2.5-7b-codegen", "h100-roce")
    assert "calibrated on other hardware, scaled x2 for h100" in c.source
    assert "calibrated on other hardware" in c.describe() and "GPU-hours" in c.describe()


def test_no_prediction_without_a_model_and_none_needed_without_gpus() -> None:
    cpu = cost_of("tiny-gsm8k", "local")
    assert cpu.gpu_hours == 0.0 and "no GPU-hours" in cpu.describe()
    trl_gpu = cost_of("tiny-gsm8k", "a100-ib", "resources.gpus_per_node=1")
    assert trl_gpu.gpu_hours is None and "no step-time model for the trl engine" in trl_gpu.source


def test_budget() -> None:
    c = cost_of("qwen2.5-3b-gsm8k-lora", "a100-ib", "train.total_training_steps=100")
    check_budget([("run", c)], c.gpu_hours + 0.1)
    with pytest.raises(SpecError, match=r"predicted at .* GPU-hours \(2 members.*over --budget-gpu-hours 1") as exc:
        check_budget([("a", c), ("b", c)], 1, what="sweep s")
    assert exc.value.key == "--budget-gpu-hours" and "Fix: fewer steps" in str(exc.value)
    unknown = cost_of("tiny-gsm8k", "a100-ib", "resources.gpus_per_node=1")
    with pytest.raises(SpecError, match="cannot be checked against --budget-gpu-hours"):
        check_budget([("run", unknown)], 100)
