"""MATH boxed-answer reward: the last `\\boxed{...}` of a completion against the reference, both normalised the way
MATH answers usually are (Hendrycks et al.'s string rules), so `\\dfrac{1}{2}`, `\\frac12` and `0.5` agree.

Stdlib only and linear in the text: verl's reward workers and trl's trainer call it on every completion.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from typing import Any

from hpc_grpo.rewards.completions import texts_and_truths

__all__ = ["last_boxed", "normalise", "is_equiv", "math_reward", "make_trl_reward", "compute_score"]

_BOX_COMMANDS = ("\\boxed", "\\fbox")


def last_boxed(text: str) -> str | None:
    """The content of the last `\\boxed{...}` (or `\\fbox{...}`, or `\\boxed 5`) with its braces balanced; None when
    there is none or its braces never close."""
    start = max(text.rfind(c) for c in _BOX_COMMANDS)
    if start < 0:
        return None
    command = next(c for c in _BOX_COMMANDS if text.startswith(c, start))
    rest = text[start + len(command):]
    if rest.startswith(" "):  # `\boxed 5$`: up to the closing dollar or the end of the line
        return re.split(r"[$\n]", rest[1:], maxsplit=1)[0].strip() or None
    if not rest.startswith("{"):
        return None
    depth = 0
    for i, ch in enumerate(rest):
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return rest[1:i]
    return None


_DROP = ("\\left", "\\right", "\\!", "\\,", "\\;", "\\:", "\\$", "$", "\\%", "%", "^{\\circ}", "^\\circ",
         "\\displaystyle")
_UNITS = re.compile(r"\\(?:text|textbf|mbox|mathrm)\{\s*[^{}]*\}")
_FRAC_SHORT = re.compile(r"\\frac(\d)(\d)")
_FRAC_HALF = re.compile(r"\\frac(\{[^{}]*\})(\d)|\\frac(\d)(\{[^{}]*\})")
_SQRT_SHORT = re.compile(r"\\sqrt(\w)")
_SLASH_FRAC = re.compile(r"^(-?\d+)/(\d+)$")
_LHS = re.compile(r"^[A-Za-z]\w{0,2}\s*=")


def _units_and_text(s: str) -> str:
    """`5\\text{ cm}` -> `5` (a unit after the number); `\\text{(A)}` alone -> `(A)` (the text is the answer)."""
    stripped = _UNITS.sub("", s)
    if stripped.strip():
        return stripped
    return re.sub(r"\\(?:text|textbf|mbox|mathrm)\{([^{}]*)\}", r"\1", s)


def _fracs(s: str) -> str:
    """`\\frac12` -> `\\frac{1}{2}`, `\\frac{a}2` -> `\\frac{a}{2}`, `3/4` -> `\\frac{3}{4}`."""
    s = _FRAC_SHORT.sub(r"\\frac{\1}{\2}", s)
    s = _FRAC_HALF.sub(lambda m: f"\\frac{m[1]}{{{m[2]}}}" if m[1] else f"\\frac{{{m[3]}}}{m[4]}", s)
    m = _SLASH_FRAC.match(s)
    return f"\\frac{{{m[1]}}}{{{m[2]}}}" if m else s


def normalise(answer: str) -> str:
    """One spelling for equal MATH answers: no spaces, `\\left`/`\\right`, `\\!`, dollars, percent and degree
    signs, units in `\\text{...}`, `x =` before a value, trailing `.`; `dfrac`/`tfrac` -> `frac`; short fractions and
    roots braced; `0.5` -> `\\frac{1}{2}`; a leading `.5` -> `0.5`."""
    s = answer.replace("\n", "").replace("\\\\", "\\").strip()
    s = s.replace("dfrac", "frac").replace("tfrac", "frac")
    for token in _DROP:
        s = s.replace(token, "")
    s = _units_and_text(s)
    s = s.replace(" .", " 0.").replace("{.", "{0.")
    s = s.strip().rstrip(".").strip()
    if s.startswith("."):
        s = "0" + s
    if _LHS.match(s) and s.count("=") == 1:
        s = s.split("=", 1)[1]
    s = _SQRT_SHORT.sub(r"\\sqrt{\1}", s)
    s = s.replace(" ", "")
    s = _fracs(s)
    if s == "0.5":
        s = "\\frac{1}{2}"
    return s


def is_equiv(answer: str, truth: str) -> bool:
    """Equal after normalise (a plain string compare where normalising fails on odd input)."""
    try:
        return normalise(answer) == normalise(truth)
    except (re.error, IndexError):  # pragma: no cover - the regexes are fixed; kept as the documented fallback
        return answer.strip() == truth.strip()


def math_reward(solution_str: str, ground_truth: str, format_score: float = 0.0, score: float = 1.0) -> float:
    """`score` when the last boxed answer equals the reference, `format_score` for a boxed but wrong answer, 0.0
    when nothing is boxed (as the GSM8K scorer treats a missing `#### N`)."""
    answer = last_boxed(solution_str)
    if answer is None:
        return 0.0
    return float(score) if is_equiv(answer, str(ground_truth)) else float(format_score)


def make_trl_reward(format_score: float = 0.0) -> Callable[..., list[float]]:
    """A trl reward function; trl logs its metric under __name__ (`math_boxed`)."""

    def math_boxed(completions: Iterable[Any], ground_truth: Iterable[Any], **kwargs: Any) -> list[float]:
        texts, truths = texts_and_truths(completions, ground_truth)
        return [math_reward(text, str(gt), format_score=format_score) for text, gt in zip(texts, truths)]

    return math_boxed


def compute_score(data_source: str, solution_str: str, ground_truth: str, extra_info: Any = None,
                  format_score: float = 0.0, **_: Any) -> float:
    """verl's custom_reward_function signature (reward.custom_reward_function.name=compute_score)."""
    return math_reward(solution_str, str(ground_truth), format_score=format_score)
