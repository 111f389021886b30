"""What plan predicts a run costs (planning.cost): GPU-hours from the steps, the step-time model and the GPUs, the
eval job's upper bound, checkpoint disk, the calibration named beside the figure, --budget-gpu-hours, and a
sweep's upper bound beside its expected cost with successive halving."""

from __future__ import annotations

import pytest

from hpc_grpo.common.yamlio import SpecError
from hpc_grpo.config.resolve import resolve_spec
from hpc_grpo.planning.cost import BUDGET_FIGURE, CALIBRATION, SweepCost, check_budget, going_on, run_cost
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
    with pytest.raises(SpecError, match=r"predicted at .* GPU-hours, the upper bound \(2 members.*over --budget-gpu-hours 1") as exc:
        check_budget([("a", c), ("b", c)], 1, what="sweep s")
    assert exc.value.key == "--budget-gpu-hours" and "Fix: fewer steps" in str(exc.value)
    unknown = cost_of("tiny-gsm8k", "a100-ib", "resources.gpus_per_node=1")
    with pytest.raises(SpecError, match="cannot be checked against --budget-gpu-hours"):
        check_budget([("run", unknown)], 100)


def test_members_going_on_past_each_rung() -> None:
    assert [going_on(4, 2, k) for k in range(3)] == [4, 2, 1]
    assert [going_on(3, 3, k) for k in range(2)] == [3, 1]
    assert going_on(2, 4, 1) == 1.0  # at least the best member trains to the end
    assert going_on(8, 2, 1) == 4 and going_on(9, 3, 2) == 1


def test_expected_cost_with_halving_pays_each_span_at_the_share_that_trains_it() -> None:
    c = cost_of("qwen2.5-3b-gsm8k-lora", "a100-ib", "train.total_training_steps=100")
    members = [(f"m{i}", c) for i in range(4)]
    plain = SweepCost(members, [], 2)
    assert plain.upper_bound == pytest.approx(4 * c.gpu_hours) and plain.expected == plain.upper_bound
    halving = SweepCost(members, [10, 30], 2)
    assert halving.upper_bound == plain.upper_bound and halving.survivors() == [4, 2, 1]
    # every member pays its start-up and 10 steps; half of them 20 more; a quarter the last 70 and the eval job
    steps = 4 * 10 + 2 * 20 + 1 * 70
    want = (4 * c.startup_s + steps * c.step_s) * c.gpus / 3600 + 1 * c.eval_gpu_hours
    assert halving.expected == pytest.approx(want)
    assert c.gpu_hours < halving.expected < halving.upper_bound  # above one winner's run, below all four
    later = SweepCost(members, [50, 90], 2)
    assert halving.expected < later.expected < later.upper_bound  # later rungs save less
    # a rung at or past a member's last step stops no one: every member trains to the end and is evaluated
    assert SweepCost(members, [100, 200], 2).expected == pytest.approx(plain.upper_bound)
    text = halving.describe()
    assert text.startswith(f"~{halving.upper_bound:.1f} GPU-hours, every member to its last step (the upper bound)")
    assert f"expected with successive halving at steps 10, 30 (eta 2): ~{halving.expected:.1f} GPU-hours" in text
    assert "members training past each rung: 4 -> 2 -> 1" in text and CALIBRATION in text
    assert halving.as_dict()["expected_gpu_hours"] == halving.expected


def test_expected_cost_unknown_without_a_step_model_and_zero_without_gpus() -> None:
    trl_gpu = cost_of("tiny-gsm8k", "a100-ib", "resources.gpus_per_node=1")
    sweep = SweepCost([("a", trl_gpu), ("b", trl_gpu)], [2], 2)
    assert sweep.upper_bound is None and sweep.expected is None
    assert sweep.describe().startswith("no prediction (no step-time model for the trl engine")
    cpu = cost_of("tiny-gsm8k", "local")
    cpus = SweepCost([("a", cpu), ("b", cpu)], [2], 2)
    assert cpus.expected == 0.0 and cpus.upper_bound == 0.0
    assert cpus.describe() == ("no GPU-hours (CPU jobs); successive halving at steps 2 (eta 2): members training "
                               "past each rung: 2 -> 1")


def test_a_sweeps_budget_is_checked_against_its_upper_bound() -> None:
    c = cost_of("qwen2.5-3b-gsm8k-lora", "a100-ib", "train.total_training_steps=100")
    members = [(f"m{i}", c) for i in range(4)]
    halving = SweepCost(members, [10], 2)
    between = (halving.expected + halving.upper_bound) / 2  # the expected fits, the upper bound does not
    with pytest.raises(SpecError) as exc:
        check_budget(members, between, what="sweep s", expected=halving.expected)
    text = str(exc.value)
    assert f"predicted at {halving.upper_bound:.1f} GPU-hours, the upper bound (4 members, each to its last step" in text
    assert f"with successive halving ~{halving.expected:.1f} are expected, an estimate that the budget is not" in text
    check_budget(members, halving.upper_bound + 0.1, what="sweep s", expected=halving.expected)
    assert BUDGET_FIGURE.startswith("the upper bound")
