"""The scorer's side of a test: the runner's outcome for it -> passed or not.

A function test is judged in the judge process (hpc_grpo/sandbox/sandbox_judge.py): its outcome is the judge's
verdict, `["pass"]` or `["fail", Name]`, and the solution's process cannot write to the judge's pipe. A stdin test's
outcome is the printed text as the solution's process sent it (`["value", payload]`, at most VALUE_CAP bytes): every
byte may be forged, and the scorer runs in verl's reward threads and trl's step, so the text is decoded as one
JSON string and compared token by token, stopping at the first difference (a cost the completion cannot raise).
"""

from __future__ import annotations

import json
import re
from itertools import zip_longest
from typing import Any

__all__ = ["judge", "stdout_equal"]

_TOKEN = re.compile(r"\S+")  # one character class: no backtracking


def stdout_equal(got: str, expected: str) -> bool:
    """got.split() == expected.split(), token by token, stopping at the first difference."""
    pairs = zip_longest(_TOKEN.finditer(got), _TOKEN.finditer(expected))
    return all(a is not None and b is not None and a.group() == b.group() for a, b in pairs)


def judge(test: Any, outcome: Any) -> bool:
    """Did the test (a code_tests.CodeTest) pass, given the runner's outcome for it: the judge's ["pass"] for a
    function test, ["value", payload] for a stdin test; anything else (failed, raised, too large, missing) fails."""
    if not isinstance(outcome, list) or not outcome:
        return False
    if test.check[0] == "judged":
        return outcome == ["pass"]
    if test.check[0] != "stdout" or outcome[0] != "value" or len(outcome) != 2 or not isinstance(outcome[1], str):
        return False
    if not outcome[1].startswith('"'):
        return False
    try:
        got = json.loads(outcome[1])
    except (ValueError, RecursionError):
        return False
    return type(got) is str and stdout_equal(got, test.check[1])
