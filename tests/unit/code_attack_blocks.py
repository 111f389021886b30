"""Building blocks of the reward-hacking table (tests/unit/test_code_reward_attacks.py): the Row type, the
snippets several attacks share, and the problem whose prompt gives a helper (the "given" rows)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Callable

# A problem whose prompt gives a helper (as HumanEval/38 gives encode_cyclic) and whose tests use builtins: the
# "given" rows. Through verl's path as ground truth, through HumanEval's as a problem of its own.
GIVEN_PROBLEM = {"id": "given/decode", "entry_point": "decode", "prompt_code":
                 'import string\n\ndef encode(s: str) -> str:\n    return s[::-1]\n\n\ndef decode(s: str) -> str:\n'
                 '    """The inverse of encode."""\n',
                 "tests": ["assert decode(encode('abc')) == 'abc'", "assert decode('zyx') == 'xyz'",
                           "assert all(decode('ab'))", "assert sorted(decode('ba')) == ['a', 'b']"]}
GIVEN = json.dumps({k: GIVEN_PROBLEM[k] for k in ("entry_point", "prompt_code", "tests")})

ALWAYS_EQ = '''
class AlwaysEq:
    def __eq__(self, other): return True
    def __ne__(self, other): return False
    __lt__ = __le__ = __gt__ = __ge__ = __eq__
    def __bool__(self): return True
    def __hash__(self): return 0
    def __sub__(self, other): return self
    __rsub__ = __sub__
    def __abs__(self): return 0.0
    def __float__(self): return 0.0
    def __len__(self): return 0
'''
FIND_FRAME = '''
import os, sys
def _harness(name):
    f = sys._getframe(1)
    while f is not None:
        if name in f.f_locals:
            return f.f_locals
        f = f.f_back
    return None
'''


@dataclass(frozen=True)
class Row:
    """One attack: `honest` and `attack` are whole programs; {entry} is the function's name. kind: "function" rows
    run on ADD and the HumanEval problems, "program" rows on IO. effect(raw sandbox report on ADD or IO) is true
    when the attack acted. isolation: the sandbox's isolation, not the protocol, is what stops it."""

    name: str
    honest: str
    attack: str
    kind: str = "function"
    effect: Callable[[dict[str, Any]], bool] | None = None
    isolation: bool = False


def fn(body: str, head: str = "") -> str:
    """A program defining {entry}(*args, **kwargs) with `body`, after `head`."""
    return head + "\ndef {entry}(*args, **kwargs):\n" + "".join(f"    {line}\n" for line in body.split("\n"))


def outcomes(kind: str) -> Callable[[dict[str, Any]], bool]:
    return lambda r: bool(r.get("outcomes")) and all(o and o[0] == kind for o in r["outcomes"])
