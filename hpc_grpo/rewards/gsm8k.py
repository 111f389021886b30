"""GSM8K rewards with verl's exact scoring semantics (verl/utils/reward_score/gsm8k.py).

The trl engine must score completions exactly as verl does on GPU, so a run on either engine
reports the same reward for the same text. Stdlib only: this is imported by the CLI and by
reward workers.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any
from collections.abc import Callable

from hpc_grpo.rewards.completions import texts_and_truths

__all__ = [
    "SOLUTION_CLIP_CHARS",
    "extract_solution",
    "gsm8k_reward",
    "gsm8k_trl_reward",
]

# verl only looks at the tail: regexes over very long rollouts are slow, and the answer is at the end.
SOLUTION_CLIP_CHARS = 300

_STRICT_RE = re.compile(r"#### (\-?[0-9\.\,]+)")
_FLEXIBLE_RE = re.compile(r"(\-?[0-9\.\,]+)")
_FLEXIBLE_INVALID = ("", ".")


def extract_solution(text: str, method: str = "strict") -> str | None:
    """Return the answer verl would extract from `text`, or None if there is none.

    strict: last `#### N` in the last 300 characters, with `,` and `$` removed (this also checks
    the output format). flexible: the last number-like run in the last 300 characters that is
    not "" or "." (commas kept, as verl does).
    """
    if method not in ("strict", "flexible"):
        raise ValueError(f"unknown method {method!r}: use 'strict' or 'flexible'")
    if len(text) > SOLUTION_CLIP_CHARS:
        text = text[-SOLUTION_CLIP_CHARS:]
    if method == "strict":
        matches = _STRICT_RE.findall(text)
        if not matches:
            return None
        return matches[-1].replace(",", "").replace("$", "")
    for candidate in reversed(_FLEXIBLE_RE.findall(text)):
        if candidate not in _FLEXIBLE_INVALID:
            return candidate
    # verl would return the last invalid candidate (e.g. ".") here; None says "no answer" honestly
    # and scores the same (a "." never equals a numeric ground truth).
    return None


def gsm8k_reward(
    solution_str: str,
    ground_truth: str,
    format_score: float = 0.0,
    score: float = 1.0,
    method: str = "strict",
) -> float:
    """verl's compute_score: `score` on exact string match, `format_score` if an answer was
    extracted but is wrong, 0.0 if none was extracted. No numeric normalisation ("42.00" != "42")."""
    answer = extract_solution(solution_str, method=method)
    if answer is None:
        return 0.0
    return float(score) if answer == ground_truth else float(format_score)


def make_trl_reward(method: str = "strict", format_score: float = 0.0) -> Callable[..., list[float]]:
    """A trl reward function with verl's scorer settings; trl names the logged metric after __name__."""

    def reward(completions: Iterable[Any], ground_truth: Iterable[Any], **kwargs: Any) -> list[float]:
        texts, truths = texts_and_truths(completions, ground_truth)
        return [gsm8k_reward(text, str(gt), format_score=format_score, method=method) for text, gt in zip(texts, truths)]

    reward.__name__ = f"gsm8k_{method}"
    return reward


# verl's default: strict, 0 for a wrong answer.
gsm8k_trl_reward = make_trl_reward()


def compute_score(data_source: str, solution_str: str, ground_truth: str, extra_info: Any = None,
                  method: str = "strict", format_score: float = 0.0, **_: Any) -> float:
    """verl's custom_reward_function signature (reward.custom_reward_function.name=compute_score), so a verl
    run can use the flexible scorer or a format score, as trl runs do (a random model never writes "#### N")."""
    return gsm8k_reward(solution_str, str(ground_truth), format_score=format_score, method=method)
