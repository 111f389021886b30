"""Countdown arithmetic: reach the target from the given numbers with + - * / and parentheses, each number used at
most once. The reward (verl's compute_score, trl's factory) and its data (prepare_countdown: problems generated from a
seed, nothing downloaded), one module; its registry entry is `countdown` in hpc_grpo/config/reward_registry.py.

What is scored is the completion's LAST arithmetic expression: a run of digits, spaces, `+ - * / ( )` and `.` on one
line holding an operator (so "(8 - 2) * 4 = 24" answers with "(8 - 2) * 4", and anything written after the answer
replaces it). The expression is parsed with `ast` and evaluated by walking the tree with exact fractions, never by
eval: only binary + - * / over integer literals, each literal one of the given numbers and used at most as often as
it is given. 1.0 when it equals the target; `format_score` for a well-formed expression (that grammar, the given
numbers, no division by zero) with another value; 0.0 for anything else: no expression, `**`, `//`, unary signs,
floats, numbers not given or reused, a literal glued to letters ("0x1f", "1e3"), an over-long expression.
"""

from __future__ import annotations

import ast
import json
import random
import re
from collections import Counter
from collections.abc import Callable, Iterable
from fractions import Fraction
from functools import partial
from pathlib import Path
from typing import Any

from hpc_grpo.common.atomic import atomic_write
from hpc_grpo.data.gsm8k import DataError, PrepareResult, _write_jsonl, _write_parquet
from hpc_grpo.rewards.completions import texts_and_truths

DATA_SOURCE = "hpc_grpo/countdown"  # verl scores it with this module's compute_score, never by data_source
MAX_EXPRESSION_CHARS = 200  # longer runs are not an answer (and never reach the parser)
_RUN = re.compile(r"[0-9 \t+\-*/().]+")  # one line's candidate: no newline, no letters, no `=`
_OPS = {ast.Add: Fraction.__add__, ast.Sub: Fraction.__sub__, ast.Mult: Fraction.__mul__,
        ast.Div: Fraction.__truediv__}
INSTRUCTION = ("Using the numbers {numbers}, each at most once, and + - * / with parentheses, write an expression "
               "equal to {target}. End your answer with the expression alone, e.g. (a + b) * c.")


class Malformed(ValueError):
    """The last expression is not one the puzzle allows (why, for tests and debugging)."""


# ------------------------------------------------------------------------------------------------ the scorer
def parse_ground_truth(ground_truth: Any) -> tuple[list[int], int]:
    """(numbers, target) from a row's ground truth: {"numbers": [...], "target": N} or its JSON text. ValueError or
    TypeError for anything else (the trl job checks the first row with it: foreign data is named at start)."""
    obj = json.loads(ground_truth) if isinstance(ground_truth, str | bytes) else ground_truth
    if not isinstance(obj, dict) or set(obj) != {"numbers", "target"}:
        raise ValueError(f"a countdown ground truth is {{'numbers': [...], 'target': N}}, not {ground_truth!r}")
    numbers, target = obj["numbers"], obj["target"]
    if (not isinstance(numbers, list) or not numbers or not all(type(n) is int and n > 0 for n in numbers)
            or type(target) is not int):
        raise ValueError(f"countdown numbers must be positive integers and the target an integer: {ground_truth!r}")
    return numbers, target


def last_expression(text: str) -> str | None:
    """The last run of arithmetic characters holding an operator and a digit, stripped of spaces and a sentence's
    final dots; None when the text has none. A run glued to a letter, digit or `_` outside it is returned with a
    marker that cannot parse, so "0x1f" or "1e3+2" never counts as its arithmetic-looking tail."""
    found = None
    for m in _RUN.finditer(text):
        run = m.group()
        stripped = run.strip(" \t").rstrip(".")
        if not any(c.isdigit() for c in stripped) or not any(c in "+-*/" for c in stripped):
            continue
        start = m.start() + (len(run) - len(run.lstrip(" \t")))
        end = start + len(stripped)
        glued = (start > 0 and (text[start - 1].isalnum() or text[start - 1] == "_")) or \
                (end < len(text) and (text[end].isalnum() or text[end] == "_"))
        found = "#glued" if glued else stripped
    return found


def evaluate(expression: str, numbers: Iterable[int]) -> Fraction:
    """The exact value of an allowed expression over the given numbers; Malformed names why it is not allowed."""
    if expression == "#glued":
        raise Malformed("the expression is glued to letters or other digits")
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise Malformed(f"longer than {MAX_EXPRESSION_CHARS} characters")
    try:
        tree = ast.parse(expression, mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:
        raise Malformed(f"does not parse: {exc.__class__.__name__}") from None
    used: list[int] = []
    for node in ast.walk(tree.body):  # the grammar and the numbers first: nothing is computed for a wrong form
        if isinstance(node, ast.Constant) and type(node.value) is int:
            used.append(node.value)
        elif not (isinstance(node, ast.BinOp) and type(node.op) in _OPS or isinstance(node, ast.operator)):
            raise Malformed(f"{type(node).__name__} is not + - * / over integers")
    extra = Counter(used) - Counter(numbers)
    if extra:
        raise Malformed(f"uses {sorted(extra.elements())} beyond the given numbers")

    def value(node: ast.expr) -> Fraction:
        if isinstance(node, ast.Constant) and type(node.value) is int:
            return Fraction(node.value)
        assert isinstance(node, ast.BinOp)  # checked above
        left, right = value(node.left), value(node.right)
        if isinstance(node.op, ast.Div) and right == 0:
            raise Malformed("division by zero")
        return _OPS[type(node.op)](left, right)

    return value(tree.body)


def countdown_reward(text: str, numbers: Iterable[int], target: int, format_score: float = 0.0,
                     score: float = 1.0) -> float:
    """`score` when the last expression equals the target, `format_score` when it is allowed but another value,
    0.0 otherwise (see the module's docstring)."""
    expression = last_expression(text)
    if expression is None:
        return 0.0
    try:
        value = evaluate(expression, numbers)
    except Malformed:
        return 0.0
    return float(score) if value == target else float(format_score)


def compute_score(data_source: str, solution_str: str, ground_truth: Any, extra_info: Any = None,
                  format_score: float = 0.0, **_: Any) -> float:
    """verl's custom_reward_function signature (reward.custom_reward_function.name=compute_score)."""
    numbers, target = parse_ground_truth(ground_truth)
    return countdown_reward(solution_str, numbers, target, format_score=format_score)


def make_trl_reward(format_score: float = 0.0) -> Callable[..., list[float]]:
    """A trl reward function; trl logs its metric under __name__ (`countdown`)."""

    def countdown(completions: Iterable[Any], ground_truth: Iterable[Any], **kwargs: Any) -> list[float]:
        texts, truths = texts_and_truths(completions, ground_truth)
        return [countdown_reward(text, *parse_ground_truth(gt), format_score=format_score)
                for text, gt in zip(texts, truths)]

    return countdown


# ------------------------------------------------------------------------------------------------ the data
def make_problem(rng: random.Random, count: int, max_number: int = 25) -> dict[str, Any]:
    """`count` numbers and a target some expression over all of them reaches (built here, so every problem is
    solvable): numbers are combined pairwise in a random order with an operator that keeps the value a positive
    integer. The numbers are shuffled so their order does not give the solution away."""
    numbers = [rng.randint(1, max_number) for _ in range(count)]
    values = list(numbers)
    while len(values) > 1:
        a, b = values.pop(rng.randrange(len(values))), values.pop(rng.randrange(len(values)))
        choices = [a + b, a * b] + ([a - b] if a > b else [b - a] if b > a else [])
        choices += [a // b] if a % b == 0 else [b // a] if b % a == 0 else []
        values.append(rng.choice(choices))
    rng.shuffle(numbers)
    return {"numbers": numbers, "target": values[0]}


def make_prompt(problem: dict[str, Any]) -> list[dict[str, str]]:
    numbers = ", ".join(str(n) for n in problem["numbers"])
    return [{"role": "user", "content": INSTRUCTION.format(numbers=numbers, target=problem["target"])}]


def prepare_countdown(out_dir: str | Path, seed: int = 0, train: int = 2000, test: int = 200,
                      numbers: int = 4) -> PrepareResult:
    """Write out_dir/verl/{train,test}.parquet and out_dir/trl/{train,test}.jsonl: `train` + `test` problems from
    random.Random(seed) (the same seed, the same files), test problems never repeating a train one."""
    if not 2 <= numbers <= 6:
        raise DataError("--numbers", None, f"{numbers} numbers per problem", "give 2 to 6")
    if train < 1 or test < 1:
        raise DataError("--train/--test", None, f"{train} train and {test} test problems", "give at least 1 of each")
    rng = random.Random(seed)
    splits: dict[str, list[dict[str, Any]]] = {"train": [], "test": []}
    seen: set[str] = set()
    for split, n in (("train", train), ("test", test)):
        for _ in range(50 * n):
            if len(splits[split]) == n:
                break
            problem = make_problem(rng, numbers)
            key = json.dumps([sorted(problem["numbers"]), problem["target"]])
            if key not in seen:
                seen.add(key)
                splits[split].append(problem)
        if len(splits[split]) < n:
            raise DataError("--numbers", None, f"only {len(splits[split])} distinct {split} problems",
                            "ask for fewer problems or more numbers")
    out = Path(out_dir).expanduser()
    for kind in ("verl", "trl"):
        (out / kind).mkdir(parents=True, exist_ok=True)
    for split, rows in splits.items():
        truths = [json.dumps(p, sort_keys=True) for p in rows]
        verl = [{"data_source": DATA_SOURCE, "prompt": make_prompt(p), "ability": "arithmetic",
                 "reward_model": {"style": "rule", "ground_truth": gt}, "extra_info": {"split": split, "index": i}}
                for i, (p, gt) in enumerate(zip(rows, truths))]
        trl = [{"prompt": make_prompt(p), "ground_truth": gt} for p, gt in zip(rows, truths)]
        atomic_write(out / "verl" / f"{split}.parquet", partial(_write_parquet, verl))
        atomic_write(out / "trl" / f"{split}.jsonl", partial(_write_jsonl, trl))
    return PrepareResult(out, out / "verl" / "train.parquet", out / "verl" / "test.parquet",
                         out / "trl" / "train.jsonl", out / "trl" / "test.jsonl", train, test, f"seed {seed}")
