"""verl's GSM8K scoring semantics (VERL.md "GSM8K in verl", GSM8K.md "Scoring used by verl")."""

from __future__ import annotations

import pytest

from hpc_grpo.rewards.completions import completion_text
from hpc_grpo.rewards.gsm8k import extract_solution, gsm8k_reward, gsm8k_trl_reward


def test_exact_answer_scores_one() -> None:
    assert gsm8k_reward("so she sold 42 clips.\n#### 42", "42") == 1.0


def test_no_numeric_normalisation() -> None:
    # exact string compare: "42.00" is not "42"
    assert gsm8k_reward("#### 42.00", "42") == 0.0
    assert gsm8k_reward("#### 42.0", "42") == 0.0


def test_commas_removed() -> None:
    assert extract_solution("#### 1,234") == "1234"
    assert gsm8k_reward("#### 1,234", "1234") == 1.0
    assert gsm8k_reward("#### 1,234,567", "1234567") == 1.0


def test_dollar_sign() -> None:
    # verl's regex cannot capture "$", so its .replace("$", "") never fires: a "$" after the
    # marker means no match at all, and a trailing "$" simply ends the number.
    assert gsm8k_reward("#### 42$", "42") == 1.0
    assert extract_solution("#### $42") is None
    assert gsm8k_reward("#### $42", "42") == 0.0


def test_last_match_wins() -> None:
    assert extract_solution("#### 7\nno wait\n#### 8") == "8"
    assert gsm8k_reward("#### 42\nactually\n#### 43", "42") == 0.0
    assert gsm8k_reward("#### 43\nactually\n#### 42", "42") == 1.0


def test_only_last_300_chars_considered() -> None:
    tail = "x" * 300
    text = "#### 42\n" + tail
    assert len(text) > 300
    assert extract_solution(text) is None
    assert gsm8k_reward(text, "42") == 0.0
    # the same marker inside the window counts
    inside = "y" * 500 + "#### 42" + "z" * (300 - len("#### 42"))
    assert len(inside[-300:]) == 300 and inside[-300:].startswith("#### 42")
    assert gsm8k_reward(inside, "42") == 1.0
    # a marker cut by the window is not seen whole: only "### 42" remains
    cut = "#### 42" + "z" * (300 - len("### 42"))
    assert gsm8k_reward(cut, "42") == 0.0


def test_no_match_scores_zero_even_with_format_score() -> None:
    assert extract_solution("the answer is 42") is None
    assert gsm8k_reward("the answer is 42", "42") == 0.0
    assert gsm8k_reward("the answer is 42", "42", format_score=0.1) == 0.0
    assert gsm8k_reward("####42", "42", format_score=0.1) == 0.0  # the space after #### is required


def test_format_score_for_matched_but_wrong() -> None:
    assert gsm8k_reward("#### 41", "42", format_score=0.1) == pytest.approx(0.1)
    assert gsm8k_reward("#### 42", "42", format_score=0.1, score=2.0) == 2.0
    assert isinstance(gsm8k_reward("nothing", "42"), float)


def test_negative_numbers() -> None:
    assert extract_solution("#### -17") == "-17"
    assert gsm8k_reward("#### -17", "-17") == 1.0
    assert gsm8k_reward("#### -17", "17") == 0.0
    assert gsm8k_reward("#### -1,500.5", "-1500.5") == 1.0


def test_flexible_takes_last_number() -> None:
    assert extract_solution("first 3 then 5 so 12.", method="flexible") == "12."
    assert extract_solution("costs 7 dollars; i think", method="flexible") == "7"
    assert extract_solution("#### 1,234 done", method="flexible") == "1,234"  # flexible keeps commas
    # a lone "." is skipped ...
    assert extract_solution("it is 9 . ", method="flexible") == "9"
    # ... but verl skips only "" and ".", so a lone "," after the number wins (verl quirk, kept)
    assert extract_solution("costs 7 dollars, i think", method="flexible") == ","
    assert extract_solution("no digits here", method="flexible") is None
    assert gsm8k_reward("the answer is 42", "42", method="flexible") == 1.0
    with pytest.raises(ValueError):
        extract_solution("#### 1", method="loose")


def test_trl_reward_plain_strings() -> None:
    out = gsm8k_trl_reward(["#### 3", "#### 4", "no"], ground_truth=["3", "3", "3"], prompts=["p"] * 3)
    assert out == [1.0, 0.0, 0.0]


def test_trl_reward_chat_completions() -> None:
    completions = [
        [{"role": "assistant", "content": "2+2=4\n#### 4"}],
        [
            {"role": "assistant", "content": "#### 5"},
            {"role": "user", "content": "#### 4"},  # not assistant: ignored
            {"role": "assistant", "content": "hmm\n#### 6"},  # last assistant message counts
        ],
        [{"role": "assistant", "content": "#### 1,000"}],
    ]
    assert gsm8k_trl_reward(completions, ["4", "5", "1000"], completion_ids=None) == [1.0, 0.0, 1.0]
    assert completion_text(completions[1]) == "hmm\n#### 6"


def test_trl_reward_length_mismatch() -> None:
    with pytest.raises(ValueError):
        gsm8k_trl_reward(["#### 1"], ["1", "2"])
