"""The test protocol of the execution reward: what runs where.

A policy that optimises a pass-the-tests reward learns whatever raises it, including fooling the checker: an
object whose __eq__ always answers True, a harness tampered with in its own interpreter, the calling frame's
constants read, a comparison disassembled. So no test runs beside the solution. The tests run in the judge, a
process of their own (hpc_grpo/sandbox/sandbox_judge.py), where each name they call that the data set does not
define (the entry point, any function of the solution) is a proxy: its arguments go to the sandboxed solution by
value and its result comes back as exact builtin values (no subclass, no object with its own __eq__). Loops,
`all(...)`, comprehensions and the comparisons themselves run in the judge; the solution sees its arguments only.
What the prompt gives (helpers such as HumanEval/38's encode_cyclic) runs in the judge too, so a round-trip test
sends the solution the encoded text, never the answer.

The plan here only decides the tests' granularity (each is one point of the score) and which names become
proxies: a snippet (MBPP, ours) is one test; HumanEval's `def check(candidate)` body gives one test per assert that
uses no variable of check's own, and one more for the rest (loops, helper variables), run as `check(entry)`.
stdin/stdout tests send only stdin to the sandbox; the scorer compares the printed text
(hpc_grpo/rewards/code_values.py). Stdlib only.
"""

from __future__ import annotations

import ast
import builtins
import copy
import json
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

__all__ = ["CodeTest", "PlannedTests", "plan_tests", "plan_for", "given_code"]

_BUILTINS = frozenset(dir(builtins))


@dataclass(frozen=True)
class CodeTest:
    """One test: `job` goes to the runner ({"test": source} for the judge | {"stdin": text} for the sandbox);
    `check` stays with the scorer: ("judged",) (the judge's verdict) or ("stdout", expected text)."""

    job: dict[str, str]
    check: tuple[Any, ...]


@dataclass(frozen=True)
class PlannedTests:
    """A problem's tests as the protocol runs them; `prelude` is test-module code (HumanEval's METADATA, imports,
    helpers) run once in the judge; `calls` the names the judge binds to proxies (or to a standard-library module
    the tests name without importing it), the entry point always among them; `given` what the prompt gives
    (given_code), run in the judge and after the completion."""

    tests: tuple[CodeTest, ...]
    prelude: str = ""
    calls: tuple[str, ...] = ()
    given: str = ""


def _bound_names(nodes: list[ast.stmt]) -> frozenset[str]:
    """Every name a block binds anywhere (a superset of its locals)."""
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


def _loaded(nodes: list[ast.AST]) -> set[str]:
    return {n.id for node in nodes for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}


def _module_names(tree: ast.Module) -> set[str]:
    """The names a module's top level binds (defs, classes, assignments, imports)."""
    return set(_bound_names([s for s in tree.body if not isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef,
                                                                       ast.ClassDef))])) | {
        s.name for s in tree.body if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}


class _Rename(ast.NodeTransformer):
    def __init__(self, names: dict[str, str]) -> None:
        self.names = names

    def visit_Name(self, node: ast.Name) -> ast.AST:
        if node.id in self.names:
            return ast.copy_location(ast.Name(id=self.names[node.id], ctx=node.ctx), node)
        return node


def _always_true(node: ast.stmt) -> bool:
    return isinstance(node, ast.Assert) and isinstance(node.test, ast.Constant) and bool(node.test.value)


def _split_check(module: ast.Module, entry: str) -> tuple[list[str], str] | None:
    """HumanEval layout: module code + `def check(candidate): ...` -> (test sources, prelude), or None when the
    text is not that layout (then it runs whole as one test)."""
    checks = [s for s in module.body if isinstance(s, ast.FunctionDef) and s.name == "check"]
    if len(checks) != 1 or len(checks[0].args.args) != 1 or checks[0].decorator_list:
        return None
    check = checks[0]
    param = check.args.args[0].arg
    prelude = [s for s in module.body if s is not check]
    if "check" in _loaded(list(prelude)):
        return None  # the test calls check itself: keep its own order
    local = _bound_names(check.body) - {param}
    tests, rest = [], []
    for stmt in check.body:
        if _always_true(stmt):
            continue
        if isinstance(stmt, ast.Assert) and not (_loaded([stmt]) & local):
            node = _Rename({param: entry}).visit(copy.deepcopy(stmt))
            tests.append(ast.unparse(ast.fix_missing_locations(node)))
        else:
            rest.append(stmt)
    if any(isinstance(n, ast.Assert) for s in rest for n in ast.walk(s)) or param in _loaded(list(rest)):
        remainder = copy.copy(check)
        remainder.body = rest
        tests.append(ast.unparse(ast.fix_missing_locations(ast.Module(body=[remainder], type_ignores=[])))
                     + f"\ncheck({entry})\n")
    if not tests:
        return None
    return tests, ast.unparse(ast.Module(body=prelude, type_ignores=[])) if prelude else ""


def _parse(source: str) -> ast.Module | None:
    try:
        return ast.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None


@lru_cache(maxsize=1024)
def given_code(prompt_code: str, entry: str) -> str:
    """What the prompt gives besides the entry point's stub (imports, helpers such as HumanEval/38's
    encode_cyclic): run in the judge, where the tests call it, and after the completion in its own process, so a
    completion cannot redefine it. Stubs (a body of only a docstring, `pass` or `...`) are left out: the completion
    writes those. The prompt is trusted text."""
    module = _parse(prompt_code)
    if module is None:
        return ""
    body = [s for s in module.body if not (isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                                           and (s.name == entry or _stub(s)))]
    return ast.unparse(ast.Module(body=body, type_ignores=[])) if body else ""


def _stub(node: ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) -> bool:
    """A definition the completion is asked to write: a function (or a class holding one) with no code."""
    if isinstance(node, ast.ClassDef):
        return any(isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef)) and _stub(s) for s in node.body)
    return all(isinstance(s, ast.Pass) or (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))
               for s in node.body)


def plan_for(gt: dict[str, Any]) -> PlannedTests:
    """The parsed ground truth -> the tests as the protocol runs them."""
    entry = gt.get("entry_point") or ""
    tests: list[CodeTest] = []
    prelude: list[str] = []
    sources: list[ast.AST] = []
    for t in gt["tests"]:
        if isinstance(t, dict):
            tests.append(CodeTest({"stdin": str(t.get("stdin", ""))}, ("stdout", str(t.get("stdout", "")))))
            continue
        module = _parse(str(t))
        split = _split_check(module, entry) if module is not None and entry else None
        if split is not None:
            tests.extend(CodeTest({"test": s}, ("judged",)) for s in split[0])
            if split[1]:
                prelude.append(split[1])
        elif module is not None and entry and any(isinstance(s, ast.FunctionDef) and s.name == "check"
                                                  for s in module.body) and "check" not in _loaded([module]):
            tests.append(CodeTest({"test": f"{t}\ncheck({entry})\n"}, ("judged",)))
        else:
            tests.append(CodeTest({"test": str(t)}, ("judged",)))
        if module is not None:
            sources.append(module)
    given = given_code(gt.get("given") or gt.get("prompt_code") or "", entry)
    defined: set[str] = set()
    for text in (gt.get("setup") or "", given, *prelude):
        module = _parse(text)
        if module is not None:
            defined |= _module_names(module)
    calls = {n for n in _loaded(sources) if n not in _BUILTINS and n not in defined}
    if entry:
        calls.add(entry)
    return PlannedTests(tuple(tests), "\n".join(prelude), tuple(sorted(calls)), given)


@lru_cache(maxsize=4096)
def plan_tests(ground_truth_json: str) -> PlannedTests:
    """plan_for, cached on the ground-truth text (GRPO scores n completions of each prompt)."""
    return plan_for(json.loads(ground_truth_json))
