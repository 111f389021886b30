"""Execution reward for code generation, one module for both engines.

A completion is scored by running its code against the problem's tests in the sandbox
(hpc_grpo/sandbox/code_sandbox.py: its own process, namespaces and limits, killed at the end; without namespaces
on the node it refuses to run unless grpo.code.isolation=limits-only: hpc_grpo/cluster/isolation.py):

    score = pass_weight * passed/total + style_weight * style      (style counted only if a test passed)
    score = -syntax_penalty * (1 - 0.5 * parsed share)             (the code does not compile)
    score = -no_code_penalty                                        (nothing code-like in the completion)

so broken code is always below working-but-wrong code (0), and code that breaks later in the text
is penalised less (a gradient even for a model that cannot yet write Python). style is
1 - 0.2 per linter finding (pyflakes, when installed), floored at 0. Hostile code passes no test
and scores 0.

No test runs beside the solution (hpc_grpo/rewards/code_tests.py): the tests run in the judge, a process of
their own, and every call they make into the solution crosses to the sandbox by value and comes back as exact
builtin values; each comparison, loop and `all(...)` happens where the solution cannot reach.

The ground truth is one JSON string (verl's parquet column reward_model.ground_truth and trl's
ground_truth column): {"tests": [...], "entry_point": "f", "setup": "...", "prompt_code": "...", "given": "..."}
(given: code a natural-language prompt shows in a fence, hpc_grpo/data/codegen.py);
a test is a Python snippet (asserts) or {"stdin": ..., "stdout": ...} for a whole program.
trl: make_trl_code_reward(**weights). verl: reward.custom_reward_function.path=pkg://hpc_grpo.rewards.code,
name=compute_score, weights as reward_kwargs. Stdlib only at import time.
"""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any
from collections.abc import Callable

from hpc_grpo.cluster import isolation
from hpc_grpo.rewards.code_report import read_report
from hpc_grpo.rewards.code_tests import PlannedTests, plan_for, plan_tests
from hpc_grpo.rewards.code_values import judge
from hpc_grpo.rewards.completions import check_counts, texts_and_truths

__all__ = [
    "DATA_SOURCE",
    "RewardWeights",
    "CodeScore",
    "extract_code",
    "fences",
    "parse_ground_truth",
    "run_sandbox",
    "run_tests",
    "plan_of",
    "score_completion",
    "score_batch",
    "compute_score",
    "make_trl_code_reward",
    "style_score",
]

DATA_SOURCE = "hpc-grpo/codegen"
SANDBOX = isolation.SANDBOX  # the runner's file
# Loads the runner as a module, not as a script: Python compiles a script on every start (5-9 ms for the runner,
# per completion) but reads a module's cached bytecode (__pycache__, written where the checkout is writable).
_BOOT = ("import importlib.util as u,sys;s=u.spec_from_file_location('code_sandbox',sys.argv[1]);"
         "m=u.module_from_spec(s);sys.modules['code_sandbox']=m;s.loader.exec_module(m);sys.exit(m.main())")
_PY_LANGS = ("python", "py", "python3")
_LANG_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_+-")
_HINT_STARTS = ("def ", "class ", "import ", "from ", "for ", "while ", "if ", "print(")
LOCAL_SYNTAX_MAX = 64 << 10  # chars of program the scorer parses itself; longer: the sandbox compiles it (its CPU)
STYLE_MAX = 64 << 10  # chars of code pyflakes reads here; longer code gets style 0


@dataclass(frozen=True)
class RewardWeights:
    """Weights and limits of the reward; recipe keys grpo.code.* (same names)."""

    pass_weight: float = 1.0
    style_weight: float = 0.0
    syntax_penalty: float = 0.2
    no_code_penalty: float = 0.5
    per_test_timeout: float = 1.0
    memory_mb: int = 1024
    max_procs: int = 32
    isolation: str = "auto"  # grpo.code.isolation: auto | limits-only (hpc_grpo/cluster/isolation.py)


@dataclass
class CodeScore:
    """One completion's score and why (kept in verl's reward_extra_info and in eval reports)."""

    score: float
    kind: str  # passed | failed | syntax_error | no_code | timeout | program_error | crashed | sandbox_error | report_too_large
    passed: int = 0
    total: int = 0
    style: float | None = None
    seconds: float = 0.0
    detail: dict[str, Any] = field(default_factory=dict)


def extract_code(text: str) -> str | None:
    """The code in a completion: the first ```python block (else the first fenced block), else the
    whole text when it looks like code; None when there is nothing code-like. Linear in the text (str.find,
    no regex): the completion is the policy's, and this runs in the trainer."""
    first = None
    for lang, body in fences(text):
        if lang.lower() in _PY_LANGS:
            return body if body.strip() else None
        if first is None:
            first = body
    if first is not None:
        return first if first.strip() else None
    if not text.strip() or not _looks_like_code(text):
        return None
    return text


def fences(text: str) -> Iterator[tuple[str, str]]:
    """(language, body) of each fenced block: ``` then a language word and the rest of its line; the body runs
    to the next ``` or the end of the text."""
    pos = 0
    while True:
        start = text.find("```", pos)
        if start < 0:
            return
        newline = text.find("\n", start + 3)
        if newline < 0:  # no line ends after this fence: no later fence can open a block either
            return
        head = text[start + 3:min(newline, start + 3 + 64)].lstrip(" \t")
        n = 0
        while n < len(head) and head[n] in _LANG_CHARS:
            n += 1
        end = text.find("```", newline + 1)
        yield head[:n], text[newline + 1:end if end >= 0 else len(text)]
        if end < 0:
            return
        pos = end + 3


def _looks_like_code(text: str) -> bool:
    """An `=` or `(` anywhere, or a line starting (after blanks) with a Python keyword."""
    if "=" in text or "(" in text:
        return True
    for line in text.split("\n"):
        stripped = line.lstrip()
        if stripped.startswith(_HINT_STARTS) or (stripped.startswith("return") and not stripped[6:7].isidentifier()
                                                 and not stripped[6:7].isdigit()):
            return True
    return False


def _defines(code: str, name: str) -> bool:
    """Some line of `code` is `def name(` (blanks allowed around the words): a linear scan, no regex."""
    for line in code.split("\n"):
        stripped = line.lstrip()
        if stripped.startswith("def") and stripped[3:4].isspace():
            rest = stripped[3:].lstrip()
            if rest.startswith(name) and rest[len(name):].lstrip().startswith("("):
                return True
    return False


def parse_ground_truth(ground_truth: Any) -> dict[str, Any]:
    """The ground-truth JSON (a str, or an already-decoded dict) -> dict with a non-empty test list."""
    gt = json.loads(ground_truth) if isinstance(ground_truth, (str, bytes)) else dict(ground_truth)
    tests = gt.get("tests")
    if not isinstance(tests, list) or not tests:
        raise ValueError("code ground truth has no 'tests' list: prepare the data with `hpc-grpo data codegen`")
    return gt


def _syntax(code: str) -> float | None:
    """None when the code compiles, else the share of characters before the error (0..1)."""
    try:
        ast.parse(code)
        return None
    except SyntaxError as exc:
        return _share(code, exc.lineno or 1, exc.offset or 1)
    except (ValueError, RecursionError, MemoryError):  # null bytes, absurd nesting
        return 0.0


def _share(code: str, lineno: int, offset: int) -> float:
    """The share of `code` before line `lineno`, column `offset` (1-based): where its syntax error is."""
    pos = 0
    for _ in range(max(0, lineno - 1)):
        nxt = code.find("\n", pos)
        if nxt < 0:
            break
        pos = nxt + 1
    return min(1.0, (pos + max(0, offset - 1)) / max(1, len(code)))


def _reported_syntax(code: str, report: dict[str, Any]) -> float | None:
    """The sandbox's compile error of a long program (`error` "compile LINE COL"): its parsed share. It is
    reported before any of the code runs; forged later, it only lowers the completion's own score."""
    words = str(report.get("error", "")).split()
    if report.get("status") != "program_error" or words[:1] != ["compile"]:
        return None
    nums = [int(w) for w in words[1:3] if w.isdigit() and len(w) < 10]
    return _share(code, *nums) if len(nums) == 2 else 0.0


def style_score(code: str) -> float | None:
    """1 - 0.2 per pyflakes finding (unused imports, undefined names, ...), floored at 0; None
    without pyflakes. pyflakes only parses: the code is never run here."""
    try:
        from pyflakes.api import check
        from pyflakes.reporter import Reporter
    except ImportError:
        return None
    import io

    sink = io.StringIO()
    findings = check(code, "<completion>", Reporter(sink, sink))
    return max(0.0, 1.0 - 0.2 * findings)


def _program(code: str, gt: dict[str, Any]) -> str:
    """HumanEval-style prompts give the signature: a completion that writes only the body runs after
    the prompt's code; one that writes the whole function gets the prompt's imports first."""
    prompt_code = gt.get("prompt_code") or ""
    entry = gt.get("entry_point")
    if not (prompt_code and entry):
        return code
    if not _defines(code, entry):
        return prompt_code + code
    imports = [line for line in prompt_code.split("\n") if re.match(r"(import|from)\s+\w", line)]
    return "\n".join(imports + [code]) if imports else code


def plan_of(ground_truth: Any, gt: dict[str, Any] | None = None) -> PlannedTests:
    """The problem's tests as the protocol runs them (judged tests, stdin tests), cached on the ground-truth
    text."""
    if isinstance(ground_truth, bytes):
        ground_truth = ground_truth.decode()
    if isinstance(ground_truth, str):
        return plan_tests(ground_truth)
    return plan_for(gt if gt is not None else parse_ground_truth(ground_truth))


def run_sandbox(code: str, gt: dict[str, Any], plan: PlannedTests, weights: RewardWeights = RewardWeights(),
                on_outcome: Callable[[int, Any], Any] | None = None, syntax_check: bool = False) -> dict[str, Any]:
    """Run the sandbox once (a fresh process): its report, one outcome per test (raw, or what on_outcome(i, raw)
    made of it: each raw outcome, up to a MiB, is dropped once judged). The runner's output is read a line at a
    time, each line and the whole capped in bytes before parsing (sandbox_report.read_report)."""
    isolation.require(weights.isolation)  # IsolationRefused: auto, and this node gives the sandbox no namespaces
    judged = not any("stdin" in t.job for t in plan.tests)
    tests = [{} if judged else t.job for t in plan.tests]
    job = {"code": code, "tests": tests, "setup": gt.get("setup", ""), "given": plan.given, "judged": judged,
           "per_test_timeout": weights.per_test_timeout, "memory_mb": weights.memory_mb, "max_procs": weights.max_procs,
           "isolation": weights.isolation, "syntax_check": syntax_check}
    first = json.dumps(job).encode()
    part = b"%d\n" % len(first) + first
    if judged:  # the judge's part: read by the judge alone (code_sandbox._read_job), never by the code's process
        part += json.dumps({"tests": [t.job for t in plan.tests], "prelude": plan.prelude, "calls": list(plan.calls),
                            "entry": gt.get("entry_point") or ""}).encode()
    outer = weights.per_test_timeout * (len(tests) + 2) + 10.0
    proc = subprocess.Popen([sys.executable, "-I", "-S", "-c", _BOOT, str(SANDBOX)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True, cwd="/",
                            env=isolation.sandbox_env())
    return read_report(proc, part, len(tests), outer, on_outcome)


def run_tests(code: str, gt: dict[str, Any], weights: RewardWeights = RewardWeights(),
              plan: PlannedTests | None = None, syntax_check: bool = False) -> dict[str, Any]:
    """Run the sandbox and read its outcomes here, as they arrive: the sandbox's report plus passed, total and the
    failed tests' numbers (its raw outputs are dropped)."""
    plan = plan or plan_for(gt)
    tests = plan.tests
    report = run_sandbox(code, gt, plan, weights, lambda i, o: judge(tests[i], o), syntax_check)
    passed = report.pop("outcomes", None)
    if not isinstance(passed, list) or len(passed) != len(tests):
        passed = [False] * len(tests)  # a report of another shape counts nothing
    report.update(passed=sum(p is True for p in passed), total=len(tests),
                  failed=[i for i, ok in enumerate(passed, start=1) if ok is not True])
    return report


def score_completion(text: str, ground_truth: Any, weights: RewardWeights = RewardWeights()) -> CodeScore:
    """Score one completion's text against its ground truth (see the module docstring)."""
    gt = parse_ground_truth(ground_truth)
    plan = plan_of(ground_truth, gt)
    total = len(plan.tests)
    code = extract_code(text)
    if code is None:
        return CodeScore(-weights.no_code_penalty, "no_code", total=total)
    program = _program(code, gt)
    local = len(program) <= LOCAL_SYNTAX_MAX  # a longer program is compiled in the sandbox, on its CPU and memory
    parsed = _syntax(program) if local else None
    if parsed is None:
        report = run_tests(program, gt, weights, plan, syntax_check=not local)
        parsed = None if local else _reported_syntax(program, report)
    if parsed is not None:
        return CodeScore(-weights.syntax_penalty * (1.0 - 0.5 * parsed), "syntax_error", total=total,
                         detail={"parsed_share": round(parsed, 3)})
    passed = int(report["passed"])
    frac = passed / total if total else 0.0
    style = style_score(code) if weights.style_weight and len(code) <= STYLE_MAX else (0.0 if weights.style_weight else None)
    score = weights.pass_weight * frac + (weights.style_weight * style if style is not None and passed else 0.0)
    status = report.get("status", "ok")
    kind = ("passed" if passed == total else "failed") if status == "ok" else status
    return CodeScore(score, kind, passed, total, style, float(report.get("seconds", 0.0)), report)


def score_batch(texts: Sequence[str], ground_truths: Sequence[Any], weights: RewardWeights = RewardWeights(),
                workers: int | None = None) -> list[CodeScore]:
    """Score many completions in parallel, one sandbox per completion, `workers` at a time
    (default: the CPUs this process may use)."""
    check_counts(len(texts), len(ground_truths))
    n = workers or len(os.sched_getaffinity(0))
    with ThreadPoolExecutor(max_workers=max(1, n)) as pool:
        return list(pool.map(lambda a: score_completion(a[0], a[1], weights), zip(texts, ground_truths)))


def compute_score(data_source: str, solution_str: str, ground_truth: Any, extra_info: Any = None,
                  **reward_kwargs: Any) -> dict[str, Any]:
    """verl's custom reward function (reward.custom_reward_function.name=compute_score). verl calls it
    once per response from a thread pool, so calls run in parallel. reward_kwargs: RewardWeights fields.
    Returns verl's dict form: 'score' plus extra info verl logs."""
    known = {k: v for k, v in reward_kwargs.items() if k in RewardWeights.__dataclass_fields__}
    result = score_completion(solution_str, ground_truth, RewardWeights(**known))
    return {"score": float(result.score), "passed": result.passed, "total": result.total,
            "syntax_error": float(result.kind == "syntax_error"), "timeout": float(result.kind == "timeout")}


def make_trl_code_reward(weights: RewardWeights = RewardWeights(), workers: int | None = None) -> Callable[..., list[float]]:
    """A trl reward function: all completions of a step scored in parallel; metric name 'code_exec'."""

    def code_exec(completions: Iterable[Any], ground_truth: Iterable[Any], **kwargs: Any) -> list[float]:
        texts, truths = texts_and_truths(completions, ground_truth)
        return [s.score for s in score_batch(texts, truths, weights, workers)]

    code_exec.__name__ = "code_exec"
    return code_exec


def make_trl_reward(workers: int | None = None, **weights: Any) -> Callable[..., list[float]]:
    """The registry's trl factory: RewardWeights fields by name (grpo.code), the job's CPUs as workers."""
    return make_trl_code_reward(RewardWeights(**weights), workers=workers or len(os.sched_getaffinity(0)))
