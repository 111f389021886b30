"""The scorer's side of a test: a value the sandbox sent back, decoded and compared with the expected one.

Every byte here may be forged by the completion, and the scorer is shared by the whole trainer (verl's reward
threads, trl's step), so its cost must not depend on what the completion chose to send:

- a payload is decoded only when its size is bounded by the test itself: for `==`/`!=` it is at most
  EQ_RATIO times the expected value's own encoding (longer cannot be equal: `!=` holds at once); truth is
  decided from the payload's length when that is long (a long payload is a non-empty value); the rest draws
  on a per-completion budget of bytes (Budget);
- sets, frozensets and dicts are never rebuilt into hashed containers: they stay lists (USet, UDict), and an
  element is only ever hashed to be LOOKED UP in the expected value's own table (built from the test's trusted
  text), so integers chosen to collide cost a lookup each, not a quadratic rebuild;
- stdout is compared token by token, stopping at the first difference.
Semantics are Python's `==`, `in`, `<`... on builtin values (1 == 1.0 == True, {1} == frozenset({1})).
"""

from __future__ import annotations

import json
import math
import operator
import re
from itertools import zip_longest
from typing import Any

__all__ = ["USet", "UDict", "Budget", "decode_value", "values_equal", "judge"]

EQ_RATIO = 128  # an int equal to a float has at most ~310 digits (a float's repr >= 3 chars); bool/complex < 16x
TRUTH_SHORT = 64  # a payload longer than this is a non-empty value or a non-zero number: truthy
BUDGET_BYTES = 4 << 20  # payload bytes per completion decoded for checks the test does not bound (in, <, truth)
_SCALARS = (type(None), bool, int, float, complex)
_ORDER = {"<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge}
_FLIP = {"<": ">", "<=": ">=", ">": "<", ">=": "<="}
_PREFIXES: dict[type, str | tuple[str, ...]] = {list: "[", tuple: '{"t"', set: ('{"s"', '{"f"'), frozenset: ('{"s"', '{"f"'), dict: '{"d"', str: '"',
             bytes: '{"b"'}  # how the encoding of a value equal to one of these types begins
_TOKEN = re.compile(r"\S+")  # one character class: no backtracking


class USet:
    """An untrusted set or frozenset: its items in a tuple, never hashed into a table."""

    __slots__ = ("items", "frozen")

    def __init__(self, items: tuple[Any, ...], frozen: bool) -> None:
        self.items, self.frozen = items, frozen

    def __repr__(self) -> str:
        return f"USet({self.items!r}, frozen={self.frozen})"


class UDict:
    """An untrusted dict: its (key, value) pairs in a tuple, never hashed into a table."""

    __slots__ = ("pairs",)

    def __init__(self, pairs: tuple[tuple[Any, Any], ...]) -> None:
        self.pairs = pairs

    def __repr__(self) -> str:
        return f"UDict({self.pairs!r})"


class Budget:
    """Payload bytes one completion may still have decoded for checks whose cost the test does not bound."""

    def __init__(self, nbytes: int = BUDGET_BYTES) -> None:
        self.left = nbytes

    def take(self, n: int) -> bool:
        if n > self.left:
            return False
        self.left -= n
        return True


def decode_value(payload: str) -> Any:
    """The sandbox's encoding of one value -> the value (sets and dicts as USet/UDict). JSON null/true/false/
    numbers/strings/arrays are themselves; {"t": [..]} tuple, {"s"|"f": [..]} set/frozenset, {"d": [[k, v], ..]}
    dict, {"b": hex} bytes, {"c": [re, im]} complex, {"i": hex} a huge int. ValueError for anything else.
    The tags are undone by json's object_hook: lists and scalars never pass through Python code here."""
    try:
        return json.loads(payload, object_hook=_untag)
    except RecursionError:
        raise ValueError("nested too deeply") from None


def _untag(x: dict) -> Any:
    if len(x) == 1:
        (tag, body), = x.items()
        if tag == "b" and type(body) is str:
            return bytes.fromhex(body)
        if tag == "i" and type(body) is str and body.lstrip("-").startswith("0x"):
            return int(body, 16)
        if tag == "c" and type(body) is list and len(body) == 2 and all(type(v) in (int, float) for v in body):
            return complex(body[0], body[1])
        if type(body) is list and tag == "t":
            return tuple(body)
        if type(body) is list and tag == "d":
            if not all(type(p) is list and len(p) == 2 and _hashable(p[0]) for p in body):
                raise ValueError("a dict item is not a pair with a hashable key")
            return UDict(tuple((p[0], p[1]) for p in body))
        if type(body) is list and tag in ("s", "f"):
            if not all(_hashable(v) for v in body):
                raise ValueError("unhashable set element")
            return USet(tuple(body), tag == "f")
    raise ValueError("not an encoded value")


def _hashable(x: Any) -> bool:
    """Would the real value be hashable (a set element, a dict key)? Walks it; computes no hash."""
    t = type(x)
    if t is tuple:
        return all(_hashable(v) for v in x)
    if t is USet:
        return x.frozen and all(_hashable(v) for v in x.items)
    return t not in (list, UDict)


def _plain(x: Any) -> bool:
    """Holds no USet/UDict anywhere: Python's own operators may compare it."""
    t = type(x)
    if t in (list, tuple):
        return all(_plain(v) for v in x)
    return t not in (USet, UDict)


def _lookup(item: Any, expected: set | frozenset | dict, table: dict) -> int | None:
    """id() of the element (or key) of the trusted `expected` equal to the untrusted `item`, or None. A plain
    item is hashed and looked up in `table`, built from `expected` alone; one holding a frozenset is compared
    with each element in turn (`expected` is the test's: its size is the test's)."""
    if _plain(item):
        try:
            found = table.get(item, _MISSING)
        except TypeError:
            return None
        return None if found is _MISSING else id(found)
    for k in expected:
        if values_equal(item, k):
            return id(k)
    return None


_MISSING = object()


def _matched(items: Any, expected: set | frozenset | dict) -> tuple[set[int], bool]:
    """The trusted elements the items match (by id) and whether some item matches none."""
    found: set[int] = set()
    extra = False
    table = {k: k for k in expected}
    for item in items:
        m = _lookup(item, expected, table)
        if m is None:
            extra = True
        else:
            found.add(m)
    return found, extra


def values_equal(got: Any, exp: Any) -> bool:
    """got == exp, for a decoded untrusted `got` and a trusted builtin `exp`."""
    te = type(exp)
    if te in _SCALARS:
        return type(got) in _SCALARS and bool(got == exp)
    if te in (str, bytes):
        return type(got) is te and got == exp
    if te in (list, tuple):
        return type(got) is te and len(got) == len(exp) and all(values_equal(g, e) for g, e in zip(got, exp))
    if te in (set, frozenset):
        if type(got) is not USet or len(got.items) != len(exp):
            return False
        found, extra = _matched(got.items, exp)
        return not extra and len(found) == len(exp)
    if te is dict:
        if type(got) is not UDict or len(got.pairs) != len(exp):
            return False
        ids = {id(k): k for k in exp}
        table = {k: k for k in exp}
        found = set()
        for k, v in got.pairs:
            m = _lookup(k, exp, table)
            if m is None or not values_equal(v, exp[ids[m]]):
                return False
            found.add(m)
        return len(found) == len(exp)
    return False


def _truth(x: Any) -> bool:
    if type(x) is USet:
        return bool(x.items)
    if type(x) is UDict:
        return bool(x.pairs)
    return bool(x)


def _members(x: Any) -> Any:
    if type(x) is USet:
        return x.items
    if type(x) is UDict:
        return [k for k, _ in x.pairs]
    if type(x) in (list, tuple):
        return x
    raise TypeError("not a container")


def _contains(container: Any, item: Any, trusted_container: bool) -> bool:
    """`item in container`, one side untrusted. TypeError where Python raises one (a failed test)."""
    if type(container) in (str, bytes):
        if type(item) is not type(container):
            raise TypeError("in: mismatched types")
        return item in container
    if trusted_container:
        if isinstance(container, (set, frozenset, dict)) and not _hashable(item):
            raise TypeError("unhashable")
        return any(values_equal(item, e) for e in container)
    return any(values_equal(g, item) for g in _members(container))


def _order(name: str, got: Any, exp: Any) -> bool:
    """got OP exp for an ordering OP. Plain values: Python's operator. A set against the expected set: subset
    and superset by lookups in the expected table. Anything else: TypeError (a failed test)."""
    if _plain(got):
        return bool(_ORDER[name](got, exp))
    if type(got) is not USet or type(exp) not in (set, frozenset):
        raise TypeError("unorderable")
    found, extra = _matched(got.items, exp)
    within, covers = not extra, len(found) == len(exp)
    return {"<=": within, "<": within and not covers, ">=": covers, ">": covers and extra}[name]


def _stdout_equal(got: str, expected: str) -> bool:
    """got.split() == expected.split(), token by token, stopping at the first difference."""
    pairs = zip_longest(_TOKEN.finditer(got), _TOKEN.finditer(expected))
    return all(a is not None and b is not None and a.group() == b.group() for a, b in pairs)


def encoded_len(value: Any) -> int:
    """The length of the sandbox's encoding of a trusted expected value (check tuples of == and != carry it)."""
    from hpc_grpo.sandbox import code_sandbox as sb  # the sandbox's own encoder: the same text for the same value

    try:
        return len(sb._encode(value))
    except (sb._TooLarge, TypeError, ValueError, RecursionError):
        return 1 << 40  # no bound: never happens for the plain values the splitter accepts


def _compare(check: tuple[Any, ...], payload: str, budget: Budget) -> bool:
    kind = check[0]
    if kind == "stdout":  # json.loads of one string and a compare that stops at the expected text's end
        got = decode_value(payload)
        return type(got) is str and _stdout_equal(got, check[1])
    if kind == "truth" and len(payload) > TRUTH_SHORT:
        return check[1] is True  # a long payload is a non-empty value or a non-zero number
    if kind == "cmp" and check[1] in ("==", "!="):
        if len(payload) > EQ_RATIO * check[4] + 64 or not payload.startswith(_PREFIXES.get(type(check[2]), "")):
            return check[1] == "!="  # too long to equal the expected value
        got = decode_value(payload)
        return values_equal(got, check[2]) is (check[1] == "==")
    if kind == "cmp" and check[1] in ("is", "is not"):
        if len(payload) > 8:
            return check[1] == "is not"
        got = decode_value(payload)
        return (got is check[2]) is (check[1] == "is")
    if not budget.take(len(payload)):
        return False
    got = decode_value(payload)
    if kind == "cmp":
        _, name, exp, hole_left = check[:4]
        if name in ("in", "not in"):
            inside = _contains(exp, got, True) if hole_left else _contains(got, exp, False)
            return inside is (name == "in")
        return _order(name, got, exp) if hole_left else _order(_FLIP[name], got, exp)
    if kind == "close":
        _, fn, exp, name, tol = check
        if type(got) not in (int, float, complex, bool):
            return False
        diff = math.fabs(got - exp) if fn == "fabs" else abs(got - exp)
        return bool(_ORDER[name](diff, tol))
    if kind == "isclose":
        _, exp, kwargs = check
        return type(got) in (int, float, bool) and math.isclose(got, exp, **dict(kwargs))
    if kind == "truth":
        return _truth(got) is check[1]
    return False


def judge(test: Any, outcome: Any, budget: Budget | None = None) -> bool:
    """Did the test (a code_tests.CodeTest) pass, given the sandbox's outcome for it: ["value", payload] for calls
    and stdin tests, ["ok"] for a weak test that raised nothing; anything else (raised, unencodable, too large,
    reported twice, missing) fails. `budget`: the completion's (a fresh one when None)."""
    if not isinstance(outcome, list) or not outcome:
        return False
    if test.check[0] == "ok":
        return outcome == ["ok"]
    if outcome[0] != "value" or len(outcome) != 2 or not isinstance(outcome[1], str):
        return False
    try:
        return _compare(test.check, outcome[1], budget or Budget())
    except (ValueError, TypeError, ArithmeticError, RecursionError, MemoryError):
        return False
