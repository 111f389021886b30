"""The MATH boxed-answer reward (hpc_grpo/rewards/math_boxed.py): the last balanced \\boxed{}, the usual MATH
normalisation, and the score for a right, a boxed but wrong, and an unboxed answer."""

from __future__ import annotations

import json

import pytest

from hpc_grpo.rewards.math_boxed import compute_score, is_equiv, last_boxed, make_trl_reward, math_reward, normalise


@pytest.mark.parametrize("text, boxed", [
    ("so $x=\\boxed{5}$.", "5"),
    ("first \\boxed{1} then \\boxed{2}", "2"),  # the last one counts
    ("\\boxed{\\frac{1}{\\sqrt{2}}}", "\\frac{1}{\\sqrt{2}}"),  # nested braces kept whole
    ("\\boxed{{a}^{b_{c}}} trailing {", "{a}^{b_{c}}"),
    ("\\fbox{7}", "7"),
    ("answer: $\\boxed 42$ done", "42"),
    ("no box here", None),
    ("\\boxed{\\frac{1}{2}", None),  # braces never close
    ("\\boxed", None),
])
def test_last_boxed_balances_braces(text: str, boxed: str | None) -> None:
    assert last_boxed(text) == boxed


@pytest.mark.parametrize("answer, truth", [
    ("\\dfrac{1}{2}", "\\frac{1}{2}"),
    ("\\tfrac12", "\\frac{1}{2}"),
    ("0.5", "\\frac12"),
    ("\\left( 3, 6 \\right)", "(3,6)"),
    ("120^\\circ", "120"),
    ("120^{\\circ}", "120"),
    ("24\\text{ cm}", "24"),
    ("12\\%", "12"),
    ("x = 6", "6"),
    ("6.", "6"),
    ("\\$5", "5"),
    ("2\\sqrt2", "2\\sqrt{2}"),
    ("3/4", "\\frac{3}{4}"),
    (".5", "0.5"),
    ("10\\!000", "10000"),
])
def test_normalisation_makes_equal_answers_equal(answer: str, truth: str) -> None:
    assert is_equiv(answer, truth), (normalise(answer), normalise(truth))


@pytest.mark.parametrize("answer, truth", [("5", "6"), ("\\frac{1}{3}", "\\frac{1}{2}"), ("(3,6)", "(6,3)"),
                                           ("-2", "2"), ("\\sqrt{3}", "3")])
def test_normalisation_keeps_different_answers_apart(answer: str, truth: str) -> None:
    assert not is_equiv(answer, truth)


def test_scores_right_boxed_wrong_and_missing() -> None:
    assert math_reward("thus \\boxed{\\dfrac{3}{4}}.", "\\frac{3}{4}", format_score=0.1) == 1.0
    assert math_reward("thus \\boxed{7}", "\\frac{3}{4}", format_score=0.1) == 0.1
    assert math_reward("thus \\boxed{7}", "\\frac{3}{4}") == 0.0
    assert math_reward("the answer is 3/4", "\\frac{3}{4}", format_score=0.1) == 0.0  # no box, no format score
    assert compute_score("hpc_grpo/math", "\\boxed{11}", "11", None, format_score=0.2) == 1.0
    assert compute_score("hpc_grpo/math", "\\boxed{12}", "11", None, format_score=0.2) == 0.2


def test_trl_reward_reads_chat_completions_and_names_its_metric() -> None:
    reward = make_trl_reward(format_score=0.1)
    assert reward.__name__ == "math_boxed"
    chats = [[{"role": "assistant", "content": "\\boxed{5}"}], [{"role": "assistant", "content": "\\boxed{4}"}], "none"]
    assert reward(chats, ground_truth=["5", "5", "5"]) == [1.0, 0.1, 0.0]
    with pytest.raises(ValueError, match="2 completions but 1"):
        reward(["a", "b"], ground_truth=["1"])


def test_every_shipped_problem_scores_its_own_solution_one() -> None:
    """The shipped sample is self-consistent: each solution's box (or answer) is its reference."""
    from hpc_grpo.data.math import SHIPPED_PROBLEMS, record

    rows = [json.loads(line) for line in SHIPPED_PROBLEMS.read_text().splitlines()]
    assert 20 <= len(rows) <= 40
    for i, row in enumerate(rows, 1):
        rec = record(row, SHIPPED_PROBLEMS, i)
        assert math_reward(rec["solution"], rec["answer"]) == 1.0, rec
