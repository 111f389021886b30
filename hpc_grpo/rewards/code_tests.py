"""The test protocol of the execution reward: what runs beside the completion, what stays with the scorer.

A policy that optimises a pass-the-tests reward learns whatever raises it, including fooling the checker:
returning an object whose __eq__ always answers True, or tampering with the harness that shares its
interpreter. So the expected answers never enter the completion's process. Each assert-style test is split
(with ast, never by running it) into
- the call, e.g. `add(1, 2)`, which the sandbox (hpc_grpo/sandbox/code_sandbox.py) evaluates beside the
  completion and sends back as plain data (exact builtin types only: a bool is not an int, a subclass of
  a builtin or any other object is refused), and
- the check, e.g. `== 3`, which stays here: the expected value is computed by a small evaluator of
  constant expressions (literals, arithmetic, a few pure builtins), and compared with the returned data
  by Python's own operators on builtin values, which the completion cannot override.
A test point can then only be earned by producing the right output: a forged report can only carry
outputs, and the completion never sees what they are compared with.

Split forms: `assert CALL OP EXPECTED` (or reversed; OP one of == != < <= > >= in, not in; is / is not
with None, True, False), `assert CALL`, `assert not CALL`, `assert abs(CALL - EXPECTED) < TOL` (abs or
math.fabs, < or <=), `assert math.isclose(CALL, EXPECTED, rel_tol=.., abs_tol=..)`, each with or without
a message. CALL is a call chain (f(...), f(...)[0], sorted(f(...)), obj.m(...)) with no comparison or
boolean operator inside, so no expected value rides along in its source. HumanEval's
`def check(candidate)` bodies are split statement by statement (candidate renamed to the entry point);
what cannot be split there (loops, helper variables, property checks) stays one test of its own.
Tests that cannot be split run as before, in the completion's interpreter ("weak" tests, counted per
problem in the reward's report): such a test's pass/fail is reported from inside the process the code
controls. stdin/stdout tests send only stdin; the scorer compares the printed text. How the scorer decodes
and compares what comes back, at a cost the completion cannot raise: hpc_grpo/rewards/code_values.py.
Stdlib only.
"""

from __future__ import annotations

import ast
import copy
import json
import operator
from dataclasses import dataclass
from functools import lru_cache
from collections.abc import Callable
from typing import Any, TypeGuard

from hpc_grpo.rewards.code_values import decode_value, encoded_len, judge

__all__ = ["CodeTest", "PlannedTests", "plan_tests", "plan_for", "decode_value", "judge", "trusted_value", "NotConstant"]

MAX_DEPTH = 100  # nesting of a returned value (the sandbox refuses deeper values too)
_OP_NAMES = {ast.Eq: "==", ast.NotEq: "!=", ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">=", ast.In: "in",
             ast.NotIn: "not in", ast.Is: "is", ast.IsNot: "is not"}
_SINGLETONS = (None, True, False)
_PLAIN_LEAVES = (type(None), bool, int, float, complex, str, bytes)


@dataclass(frozen=True)
class CodeTest:
    """One test: `job` goes to the sandbox ({"call": expr} | {"exec": source} | {"stdin": text});
    `check` stays with the scorer (see judge)."""

    job: dict[str, str]
    check: tuple[Any, ...]

    @property
    def weak(self) -> bool:
        """Run as a whole snippet in the completion's interpreter: its pass/fail can be forged from there."""
        return "exec" in self.job


@dataclass(frozen=True)
class PlannedTests:
    """A problem's tests as the protocol runs them; `prelude` is test-module code (HumanEval's METADATA,
    imports, helpers) run once after the program."""

    tests: tuple[CodeTest, ...]
    prelude: str = ""

    @property
    def weak(self) -> int:
        return sum(t.weak for t in self.tests)


class NotConstant(ValueError):
    """An expression the scorer will not evaluate itself (names, calls outside the whitelist, huge results)."""


# ---------------------------------------------------------------- the expected side: constants only

_PURE_CALLS: dict[str, Callable[..., Any]] = {"set": set, "frozenset": frozenset, "tuple": tuple, "list": list, "dict": dict, "float": float,
               "int": int, "str": str, "bool": bool, "complex": complex, "sorted": sorted, "abs": abs, "round": round,
               "range": range, "len": len, "sum": sum, "min": min, "max": max, "reversed": reversed}
_MAX_ITEMS = 1_000_000
_MAX_BITS = 100_000


def _bounded(value: Any) -> Any:
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > _MAX_BITS:
        raise NotConstant("integer too large")
    if isinstance(value, (str, bytes, list, tuple, set, frozenset, dict, range)) and len(value) > _MAX_ITEMS:
        raise NotConstant("value too large")
    return value


def _binop(op: ast.operator, a: Any, b: Any) -> Any:
    num = (int, float, complex)
    if isinstance(op, ast.Pow):
        if not (isinstance(a, num) and isinstance(b, num)):
            raise NotConstant("** on non-numbers")
        if isinstance(a, int) and isinstance(b, int) and (abs(b) > 10_000 or a.bit_length() * abs(b) > _MAX_BITS):
            raise NotConstant("** result too large")
        return a ** b
    if isinstance(op, ast.Mult) and (isinstance(a, (str, bytes, list, tuple)) or isinstance(b, (str, bytes, list, tuple))):
        seq, n = (a, b) if isinstance(b, int) else (b, a)
        if not isinstance(n, int) or len(seq) * max(n, 0) > _MAX_ITEMS:
            raise NotConstant("sequence repetition too large")
        return seq * n
    fns = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
           ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod}
    fn = fns.get(type(op))
    if fn is None or (isinstance(op, ast.Mod) and isinstance(a, (str, bytes))):  # no %-formatting
        raise NotConstant(f"operator {type(op).__name__}")
    if isinstance(op, ast.Mult) and isinstance(a, int) and isinstance(b, int) and a.bit_length() + b.bit_length() > _MAX_BITS:
        raise NotConstant("product too large")
    return fn(a, b)


def trusted_value(node: ast.AST) -> Any:
    """Evaluate a constant expression of the test's own text (never code of the completion): literals,
    containers, unary and binary arithmetic, and a few pure builtins on constants, each bounded in size.
    Raises NotConstant for anything else."""
    if isinstance(node, ast.Constant):
        if node.value is Ellipsis:
            raise NotConstant("...")
        return node.value
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        if any(isinstance(e, ast.Starred) for e in node.elts):
            raise NotConstant("starred element")
        items = [trusted_value(e) for e in node.elts]
        kind = {ast.Tuple: tuple, ast.List: list, ast.Set: set}[type(node)]
        try:
            return kind(items)
        except TypeError as exc:  # unhashable set element
            raise NotConstant(str(exc)) from None
    if isinstance(node, ast.Dict):
        if any(k is None for k in node.keys):
            raise NotConstant("** in a dict display")
        try:
            return {trusted_value(k): trusted_value(v) for k, v in zip(node.keys, node.values) if k is not None}
        except TypeError as exc:
            raise NotConstant(str(exc)) from None
    if isinstance(node, ast.UnaryOp):
        v = trusted_value(node.operand)
        if isinstance(node.op, ast.Not):
            return not v
        if not isinstance(v, (int, float, complex)):
            raise NotConstant("unary operator on a non-number")
        unary: dict[type[ast.unaryop], Callable[[Any], Any]] = {ast.USub: operator.neg, ast.UAdd: operator.pos,
                                                               ast.Invert: operator.invert}
        return unary[type(node.op)](v)
    if isinstance(node, ast.BinOp):
        try:
            return _bounded(_binop(node.op, trusted_value(node.left), trusted_value(node.right)))
        except (ArithmeticError, TypeError, ValueError) as exc:
            if isinstance(exc, NotConstant):
                raise
            raise NotConstant(f"{type(exc).__name__}: {exc}") from None
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _PURE_CALLS and not node.keywords:
        if any(isinstance(a, ast.Starred) for a in node.args):
            raise NotConstant("starred argument")
        args = [trusted_value(a) for a in node.args]
        if any(isinstance(a, range) and len(a) > _MAX_ITEMS for a in args):
            raise NotConstant("range too large")
        try:
            return _bounded(_PURE_CALLS[node.func.id](*args))
        except (ArithmeticError, TypeError, ValueError) as exc:
            raise NotConstant(f"{type(exc).__name__}: {exc}") from None
    raise NotConstant(type(node).__name__)


def _plain(value: Any, depth: int = 0) -> bool:
    """Exact builtin data, recursively (what a sandbox output can be compared with)."""
    if depth > MAX_DEPTH:
        return False
    t = type(value)
    if t in _PLAIN_LEAVES:
        return True
    if t in (list, tuple, set, frozenset):
        return all(_plain(v, depth + 1) for v in value)
    if t is dict:
        return all(_plain(k, depth + 1) and _plain(v, depth + 1) for k, v in value.items())
    return False


def _expected(node: ast.AST) -> Any:
    value = trusted_value(node)
    if not _plain(value):
        raise NotConstant(f"a {type(value).__name__} is not plain data")
    return value


# ---------------------------------------------------------------- the call side

_FORBIDDEN_IN_CALL = (ast.Compare, ast.BoolOp, ast.IfExp, ast.Lambda, ast.NamedExpr, ast.Await, ast.Yield,
                      ast.YieldFrom)


def _call_chain(node: ast.AST) -> bool:
    """f(...), f(...)[i], f(...).attr, m.f(...)(...), name: the spine holds no operator, so no constant
    outside call arguments and subscripts can ride along into the sandbox."""
    if any(isinstance(n, _FORBIDDEN_IN_CALL) for n in ast.walk(node)):
        return False
    spine = node
    while True:
        if isinstance(spine, ast.Call):
            spine = spine.func
        elif isinstance(spine, (ast.Attribute, ast.Subscript)):
            spine = spine.value
        else:
            return isinstance(spine, ast.Name)


def _free_names(node: ast.AST) -> set[str]:
    loads = {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    bound = {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    return loads - bound


class _Rename(ast.NodeTransformer):
    def __init__(self, names: dict[str, str]) -> None:
        self.names = names

    def visit_Name(self, node: ast.Name) -> ast.AST:
        if node.id in self.names:
            return ast.copy_location(ast.Name(id=self.names[node.id], ctx=node.ctx), node)
        return node


def _call_source(node: ast.AST, local: frozenset[str], rename: dict[str, str]) -> str:
    if not _call_chain(node):
        raise NotConstant("not a call chain")
    if _free_names(node) & local:
        raise NotConstant("uses a variable of the test")
    if rename:
        node = _Rename(rename).visit(copy.deepcopy(node))
    return ast.unparse(node)


def _is_abs(node: ast.AST) -> TypeGuard[ast.Call]:
    f = node.func if isinstance(node, ast.Call) else None
    return (isinstance(f, ast.Name) and f.id == "abs") or (
        isinstance(f, ast.Attribute) and f.attr == "fabs" and isinstance(f.value, ast.Name) and f.value.id == "math")


def _split_expr(expr: ast.AST, local: frozenset[str], rename: dict[str, str]) -> CodeTest:
    """The assert's expression -> a split CodeTest, or NotConstant when it has none of the split forms."""
    def call(node: ast.AST) -> dict[str, str]:
        return {"call": _call_source(node, local, rename)}

    if isinstance(expr, ast.Compare) and len(expr.ops) == 1:
        left, right, op = expr.left, expr.comparators[0], type(expr.ops[0])
        # abs(CALL - EXPECTED) < TOL, abs(EXPECTED - CALL) <= TOL (abs or math.fabs)
        if op in (ast.Lt, ast.LtE) and _is_abs(left) and len(left.args) == 1 and not left.keywords \
                and isinstance(left.args[0], ast.BinOp) and isinstance(left.args[0].op, ast.Sub):
            diff, tol = left.args[0], _expected(right)
            fn = "abs" if isinstance(left.func, ast.Name) else "fabs"
            for hole, other in ((diff.left, diff.right), (diff.right, diff.left)):
                try:
                    exp = _expected(other)
                except NotConstant:
                    continue
                return CodeTest(call(hole), ("close", fn, exp, _OP_NAMES[op], tol))
            raise NotConstant("abs() of no constant difference")
        name = _OP_NAMES[op]
        for hole, other, hole_left in ((left, right, True), (right, left, False)):
            try:
                exp = _expected(other)
            except NotConstant:
                continue
            if name in ("is", "is not") and not any(exp is s for s in _SINGLETONS):
                raise NotConstant("'is' with a value that is not None, True or False")
            return CodeTest(call(hole), ("cmp", name, exp, hole_left, encoded_len(exp)))
        raise NotConstant("no constant side")
    if isinstance(expr, ast.Call) and isinstance(expr.func, ast.Attribute) and expr.func.attr == "isclose" \
            and isinstance(expr.func.value, ast.Name) and expr.func.value.id == "math" and len(expr.args) == 2:
        kwargs = {k.arg: _expected(k.value) for k in expr.keywords}
        if set(kwargs) - {"rel_tol", "abs_tol"}:
            raise NotConstant("math.isclose keyword")
        for hole, other in ((expr.args[0], expr.args[1]), (expr.args[1], expr.args[0])):
            try:
                exp = _expected(other)
            except NotConstant:
                continue
            return CodeTest(call(hole), ("isclose", exp, tuple(sorted(kwargs.items()))))
        raise NotConstant("math.isclose with no constant side")
    if isinstance(expr, ast.UnaryOp) and isinstance(expr.op, ast.Not):
        return CodeTest(call(expr.operand), ("truth", False))
    return CodeTest(call(expr), ("truth", True))


def _always_true(node: ast.Assert) -> bool:
    try:
        return bool(trusted_value(node.test))
    except NotConstant:
        return False


def _split_assert(node: ast.stmt, local: frozenset[str] = frozenset(), rename: dict[str, str] | None = None) -> CodeTest | None:
    if not isinstance(node, ast.Assert):
        return None
    try:
        return _split_expr(node.test, local, rename or {})
    except (NotConstant, RecursionError):
        return None


def _bound_names(nodes: list[ast.stmt]) -> frozenset[str]:
    """Every name a block binds anywhere (a superset of its locals: more tests stay weak, none leaks)."""
    out: set[str] = set()
    for stmt in nodes:
        for n in ast.walk(stmt):
            if isinstance(n, ast.Name) and isinstance(n.ctx, (ast.Store, ast.Del)):
                out.add(n.id)
            elif isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                out.add(n.name)
            elif isinstance(n, (ast.Import, ast.ImportFrom)):
                out.update((a.asname or a.name).split(".")[0] for a in n.names)
            elif isinstance(n, ast.ExceptHandler) and n.name:
                out.add(n.name)
            elif isinstance(n, ast.arg):
                out.add(n.arg)
    return frozenset(out)


def _mentions(nodes: list[ast.stmt], name: str) -> bool:
    return any(isinstance(n, ast.Name) and n.id == name for s in nodes for n in ast.walk(s))


def _split_check(source: str, entry: str) -> tuple[list[CodeTest], str] | None:
    """HumanEval layout: module code + `def check(candidate): ...` -> (tests, prelude), or None when the
    text is not that layout (then it stays one weak test, as before)."""
    try:
        module = ast.parse(source)
    except (SyntaxError, ValueError, RecursionError):
        return None
    checks = [s for s in module.body if isinstance(s, ast.FunctionDef) and s.name == "check"]
    if len(checks) != 1 or len(checks[0].args.args) != 1 or checks[0].decorator_list:
        return None
    check = checks[0]
    param = check.args.args[0].arg
    prelude = [s for s in module.body if s is not check]
    if any(isinstance(s, ast.Expr) and _mentions([s], "check") for s in prelude):
        return None  # the test calls check itself: keep its own order
    local = _bound_names(check.body) - {param}
    tests, rest = [], []
    for stmt in check.body:
        if isinstance(stmt, ast.Assert) and _always_true(stmt):
            continue
        test = _split_assert(stmt, local, {param: entry})
        if test is None:
            rest.append(stmt)
        else:
            tests.append(test)
    if any(isinstance(n, ast.Assert) for s in rest for n in ast.walk(s)) or _mentions(rest, param):
        weak_check = copy.copy(check)
        weak_check.body = rest
        weak = ast.unparse(ast.fix_missing_locations(ast.Module(body=[weak_check], type_ignores=[])))
        tests.append(CodeTest({"exec": f"{weak}\ncheck({entry})\n"}, ("ok",)))
    if not tests:
        return None
    return tests, ast.unparse(ast.Module(body=prelude, type_ignores=[])) if prelude else ""


def _split_snippet(source: str) -> CodeTest:
    """One test snippet (MBPP/ours: `assert f(1) == 2`) -> a split CodeTest, else a weak one."""
    try:
        module = ast.parse(source)
    except (SyntaxError, ValueError, RecursionError):
        module = None
    if module is not None and len(module.body) == 1:
        test = _split_assert(module.body[0])
        if test is not None:
            return test
    return CodeTest({"exec": source}, ("ok",))


def plan_for(gt: dict[str, Any]) -> PlannedTests:
    """The parsed ground truth -> the tests as the protocol runs them."""
    entry = gt.get("entry_point") or ""
    tests: list[CodeTest] = []
    prelude: list[str] = []
    for t in gt["tests"]:
        if isinstance(t, dict):
            tests.append(CodeTest({"stdin": str(t.get("stdin", ""))}, ("stdout", str(t.get("stdout", "")))))
        elif entry and "def check(" in t and (split := _split_check(t, entry)) is not None:
            tests.extend(split[0])
            if split[1]:
                prelude.append(split[1])
        elif entry and "def check(" in t:
            tests.append(CodeTest({"exec": t + f"\ncheck({entry})\n"}, ("ok",)))
        else:
            tests.append(_split_snippet(str(t)))
    return PlannedTests(tuple(tests), "\n".join(prelude))


@lru_cache(maxsize=4096)
def plan_tests(ground_truth_json: str) -> PlannedTests:
    """plan_for, cached on the ground-truth text (GRPO scores n completions of each prompt)."""
    return plan_for(json.loads(ground_truth_json))
