"""Plain data across the sandbox's pipes: a call's arguments (judge -> solution) and its result (solution -> judge).

Loaded by path beside code_sandbox.py (stdlib only, like it). Only exact builtin values cross: `type(x) is int`
(a bool is a bool; an int subclass, an object with its own __eq__, a generator or anything else is refused with
TypeError), nested at most MAX_DEPTH deep and at most VALUE_CAP bytes encoded. One line of ASCII JSON each, with
tags for what JSON lacks: {"t": tuple}, {"s": set}, {"f": frozenset}, {"d": [[k, v], ...] dict}, {"b": hex bytes},
{"c": [re, im] complex}, {"i": hex} an int past Python's int <-> decimal limit. A JSON object is always a tag, so
decode is unambiguous; what it builds are the builtin types themselves, so what a test compares in the judge is
compared by Python's own operators on builtin values, which the solution cannot reach.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # annotations only: the sandbox's interpreter imports no more than it needs
    from typing import Any

MAX_DEPTH = 100  # nesting of a value
VALUE_CAP = 1 << 20  # bytes of one encoded value (a call's result or arguments, a program's stdout)


class TooLarge(Exception):
    """An encoded value over VALUE_CAP bytes."""


def tagged(x: Any, depth: int, size: list[int]) -> object:
    """x as JSON-ready data, exact builtin types only (TypeError for anything else); size[0]: items left."""
    if depth > MAX_DEPTH:
        raise ValueError("nested too deeply")
    size[0] -= 1
    if size[0] < 0:
        raise TooLarge()
    t = type(x)
    if t is int and x.bit_length() > 4096:  # past Python's int<->decimal limit: hex
        return {"i": hex(x)}
    if x is None or t is bool or t is int or t is float:
        return x
    if t is str:
        if len(x) > VALUE_CAP:
            raise TooLarge()
        return x
    if t is list:
        return [tagged(v, depth + 1, size) for v in x]
    if t is tuple:
        return {"t": [tagged(v, depth + 1, size) for v in x]}
    if t is set or t is frozenset:
        return {"s" if t is set else "f": [tagged(v, depth + 1, size) for v in x]}
    if t is dict:
        return {"d": [[tagged(k, depth + 1, size), tagged(v, depth + 1, size)]
                      for k, v in x.items()]}
    if t is bytes:
        if len(x) > VALUE_CAP // 2:
            raise TooLarge()
        return {"b": x.hex()}
    if t is complex:
        return {"c": [x.real, x.imag]}
    raise TypeError(t.__name__)


def encode(value: object, dumps=json.dumps) -> str:  # noqa: ANN001
    """One value -> one line of JSON (ASCII, no newline), at most VALUE_CAP bytes."""
    text = dumps(tagged(value, 0, [VALUE_CAP]), separators=(",", ":"))
    if len(text) > VALUE_CAP:
        raise TooLarge()
    return text


def _untag(x: dict) -> object:
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
            if not all(type(p) is list and len(p) == 2 for p in body):
                raise ValueError("a dict item is not a pair")
            return {p[0]: p[1] for p in body}  # TypeError: an unhashable key
        if type(body) is list and tag == "s":
            return set(body)
        if type(body) is list and tag == "f":
            return frozenset(body)
    raise ValueError("not an encoded value")


def decode(payload: str) -> object:
    """The encoding of one value -> the value, of exact builtin types. ValueError or TypeError for anything that is
    not an encoding (a forged line). Sets and dicts are built for real: integers chosen to collide cost the
    process that decodes them (the judge, under its CPU limit and the per-test deadline), never the trainer."""
    try:
        return json.loads(payload, object_hook=_untag)
    except RecursionError:
        raise ValueError("nested too deeply") from None
