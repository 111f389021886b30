"""Plan's run-time value rules (engines/verl_values) side by side with verl's and vLLM's own code in `.venv-verl`
(tests/unit/verl_values_probe.py, as a subprocess): for every name verl's source lists, one misspelling each, and
each sampling value at and past vLLM's bounds, plan refuses exactly what the runtime refuses. Negative clip ratios
are plan's own rule (verl runs them), said so in the rule's message."""

from __future__ import annotations

import json
import subprocess

import pytest

from hpc_grpo.engines.verl_values import choices, value_check
from tests.conftest import require_verl_yamls
from tests.unit.test_verl_runtime_parity import verl_python

ARR = "actor_rollout_ref"


def _cases(folder) -> list[tuple[str, object]]:
    names = choices(folder)
    assert names is not None and "token-mean" in names.loss_agg_modes and "grpo" in names.adv_estimators
    cases: list[tuple[str, object]] = []
    for key, known in ((f"{ARR}.actor.loss_agg_mode", names.loss_agg_modes),
                       ("algorithm.adv_estimator", names.adv_estimators),
                       (f"{ARR}.actor.policy_loss.loss_mode", names.policy_losses),
                       (f"{ARR}.actor.kl_loss_type", names.kl_types)):
        cases += [(key, name) for name in known]
        cases += [(key, f"{known[0]}-typo"), (key, "full")]
    cases.append((f"{ARR}.actor.loss_agg_mode", "seq-mean-token-summ"))
    for key, values in (("top_p", [1.0, 0.5, 1e-9, 0.0, 2.0, -0.1]), ("top_k", [-1, 0, 1, 50, -2]),
                        ("temperature", [0.0, 1.0, 2.0, -0.5, 2.5]), ("min_p", [0.0, 1.0, -0.1, 1.5])):
        cases += [(f"{ARR}.rollout.{key}", v) for v in values]
    cases += [("data.max_response_length", v) for v in (1, 1024, 0)]
    return cases


def test_plan_refuses_what_verl_and_vllm_refuse() -> None:
    folder = require_verl_yamls()
    python = verl_python()
    cases = _cases(folder)
    done = subprocess.run([python, "tests/unit/verl_values_probe.py"], input=json.dumps(cases), capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    runtime = json.loads(done.stdout.strip().splitlines()[-1])
    disagree = []
    for key, value in cases:
        item = f"{key}={value}"
        plan = "refused" if value_check([item], folder) else "ok"
        verdict = runtime[item]
        if plan != verdict.split(":", 1)[0]:
            disagree.append(f"{item}: plan {plan}, runtime {verdict}")
    assert not disagree, disagree


@pytest.mark.parametrize("item, says", [
    (f"{ARR}.actor.loss_agg_mode=seq-mean-token-summ", "is not one verl has: token-mean"),
    (f"{ARR}.rollout.top_p=2.0", "must be in (0, 1]"),
    (f"{ARR}.actor.clip_ratio_high=-0.2", "must be >= 0"),
    (f"{ARR}.actor.clip_ratio_c=0.5", "must be > 1"),
    (f"{ARR}.rollout.val_kwargs.temperature=3", "must be in [0, 2]"),
])
def test_each_refusal_names_the_key_the_value_the_rule_and_the_fix(item: str, says: str) -> None:
    folder = require_verl_yamls()
    (finding,) = value_check([item], folder, {f"{ARR}.rollout.top_p": "rollout.top_p"})
    key, value = item.split("=", 1)
    assert finding.key == f"engine.{key}" and item in finding.message and says in finding.message
    assert finding.fix and "set " in finding.fix


def test_plan_refuses_the_three_values_and_states_lora_off() -> None:
    """The values a user tried (each accepted by plan before): refused by plan with verl's key, and lora.rank=0
    stated as LoRA off (an info: it is valid)."""
    from hpc_grpo.engines.verl_keymap import resolve_with_verl_keys
    from hpc_grpo.planning.plan import run_plan

    require_verl_yamls()
    bad = [f"{ARR}.actor.loss_agg_mode=seq-mean-token-summ", f"{ARR}.rollout.top_p=2.0",
           f"{ARR}.actor.clip_ratio_high=-0.2"]
    spec, _ = resolve_with_verl_keys("qwen2.5-3b-gsm8k-lora", "h100-efa",
                                     [*bad, "lora.rank=0", "cluster.runs_root=/nonexistent/runs"], run_name="p")
    plan = run_plan(spec)
    errors = {f.key for f in plan.findings if f.severity.value == "error"}
    assert {f"engine.{b.split('=', 1)[0]}" for b in bad} <= errors, errors
    (off,) = [f for f in plan.findings if f.key == "lora.rank"]
    assert off.severity.value == "info" and "turns LoRA off" in off.message
