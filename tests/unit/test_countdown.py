"""The countdown reward (hpc_grpo/rewards/countdown.py), shipped as one module and one registry entry: the scorer
against what a policy optimising it would try, its data command as `hpc-grpo data countdown` (made by the registry,
not wired by hand), and a run on it planned with no eval task and no GSM8K files asked for."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hpc_grpo.config import reward_registry as registry
from hpc_grpo.config.resolve import resolve_spec
from hpc_grpo.rewards.countdown import (
    MAX_EXPRESSION_CHARS,
    Malformed,
    compute_score,
    countdown_reward,
    evaluate,
    last_expression,
    make_trl_reward,
    parse_ground_truth,
    prepare_countdown,
)

REPO = Path(__file__).resolve().parents[2]
NUMBERS, TARGET, FMT = [8, 2, 4, 7], 24, 0.1


def score(text: str, numbers: list[int] = NUMBERS, target: int = TARGET) -> float:
    return countdown_reward(text, numbers, target, format_score=FMT)


# ------------------------------------------------------------------------------------------------ honest answers
@pytest.mark.parametrize("text", [
    "(8 - 2) * 4", "8 * (7 - 4)", "Let me think. 8 - 2 = 6 and 6 * 4 = 24. Answer: (8 - 2) * 4",
    "(8 - 2) * 4 = 24", "The answer is (8-2)*4.", "(8 - 2) * 4\n", "(7 - 4) * 8",
    "7 * 4 - 8 / 2",
])
def test_a_right_expression_scores_one(text: str) -> None:
    assert score(text) == 1.0, last_expression(text)


def test_a_well_formed_wrong_expression_gets_the_format_score_and_not_more() -> None:
    assert score("8 + 2 + 4 + 7") == FMT  # 21, numbers fine
    assert score("7 * 2") == FMT  # a subset is allowed, its value is not the target
    assert countdown_reward("7 * 2", NUMBERS, TARGET) == 0.0  # format_score defaults to 0


def test_exact_fractions_decide_equality() -> None:
    assert score("8 / (2 - 4 / 7) ", [8, 2, 4, 7], 28) == FMT  # 8 / (10/7) = 5.6, not 28
    assert score("8 / (2 / 7) ", [8, 2, 7], 28) == 1.0  # exact: 8 * 7 / 2 = 28, no float rounding
    assert score("(2 / 7) * 7 * 4 * 3", [2, 7, 7, 4, 3], 24) == 1.0  # a fraction on the way is fine


# ------------------------------------------------------------------------------------------------ attacks
@pytest.mark.parametrize("text, expected, why", [
    ("8 * 8 - 4 * 8 - 8", 0.0, "8 used four times, given once"),
    ("(8 - 2) * 4 + 0 * 8", 0.0, "8 reused"),
    ("24", 0.0, "no operator: the target alone is not an expression"),
    ("25 - 1", 0.0, "numbers not given"),
    ("(8 - 2) * 4 * 1", 0.0, "1 not given"),
    ("6 * 4", 0.0, "an intermediate result is not a given number"),
    ("2 ** 10 - 1000", 0.0, "** is not allowed"),
    ("2 ** 2 ** 2 ** 2 ** 2 ** 2", 0.0, "a power tower: refused before anything is computed"),
    ("8 // 2 * 6", 0.0, "floor division is not allowed"),
    ("8 % 2 + 24", 0.0, "modulo is not allowed"),
    ("-8 + 32", 0.0, "a unary sign is not allowed"),
    ("+(8 - 2) * 4", 0.0, "a unary plus is not allowed"),
    ("8 / (2 - 2)", 0.0, "division by zero"),
    ("(8 - 2) * 4.0", 0.0, "a float literal"),
    ("24.0 + 0 * 8", 0.0, "a float literal"),
    ("4. * 6", 0.0, "4. is a float"),
    ("0x18 + 0", 0.0, "hex is glued letters"),
    ("1e1 + 14", 0.0, "an exponent literal is glued letters"),
    ("2_4 + 0", 0.0, "an underscore literal"),
    ("08 * 3", 0.0, "a leading zero does not parse"),
    ("(8 - 2) * 4 abc", 1.0, "ok: text after the expression is not arithmetic"),
    ("(8 - 2) * 4\n7 + 2", FMT, "the last expression counts: 7 + 2 = 9"),
    ("(8 - 2) * 4, 8 + 2", FMT, "the last expression counts: 10"),
    ("(8 - 2) * 4 or 7 - 4", FMT, "the last expression counts: 3"),
    ("(8 - 2) * 4 8 + 2", 0.0, "two expressions in one run do not parse"),
    ("(8 - 2) * 4)", 0.0, "unbalanced"),
    ("(8 - 2) * 4 *", 0.0, "a trailing operator"),
    ("[8 - 2] * 4", 0.0, "brackets are not parentheses"),
    ("(8 - 2) * 4abc", 0.0, "glued to letters after"),
    ("x(8 - 2) * 4", 0.0, "glued to letters before"),
    ("(8-2)(4)", 0.0, "a call is not arithmetic"),
    ("", 0.0, "nothing"),
    ("twenty four", 0.0, "no expression"),
    ("__import__('os').system('true') or 8*3", 0.0, "only the arithmetic run counts: 8*3, 3 not given"),
])
def test_what_a_policy_would_try_scores_nothing_or_only_what_it_earned(text: str, expected: float, why: str) -> None:
    assert score(text) == expected, (why, last_expression(text))


def test_a_long_or_deep_expression_is_refused_cheaply() -> None:
    deep = "(" * 150 + "8" + ")" * 150 + " * 3"  # over the length cap: never parsed
    nested = "(" * 95 + "8 - 2" + ")" * 95 + " * 4"  # under it: parsed, and right
    huge = "9" * 5000 + " - 1"
    chain = " + ".join(["8"] * 300)
    t0 = time.perf_counter()
    for text in (deep, huge, chain):
        assert score(text) == 0.0
    assert score(nested) == 1.0
    assert time.perf_counter() - t0 < 1.0
    with pytest.raises(Malformed, match=f"longer than {MAX_EXPRESSION_CHARS}"):
        evaluate(chain, [8] * 300)


def test_numbers_given_twice_may_be_used_twice() -> None:
    assert score("8 * 3 * 3 / 3 + 0", [8, 3, 3], 24) == 0.0  # 3 given twice, used three times; 0 not given
    assert score("8 * 3 * 3 / 3", [8, 3, 3, 3], 24) == 1.0


def test_the_ground_truth_is_checked() -> None:
    assert parse_ground_truth('{"numbers": [1, 2], "target": 3}') == ([1, 2], 3)
    for bad in ('{"numbers": [1, 2]}', '{"numbers": [], "target": 3}', '{"numbers": [1.5], "target": 3}',
                '{"numbers": [true], "target": 3}', "[1, 2, 3]", "#### 7", 7):
        with pytest.raises((ValueError, TypeError)):
            parse_ground_truth(bad)


def test_verl_and_trl_entry_points_agree() -> None:
    gt = json.dumps({"numbers": NUMBERS, "target": TARGET})
    texts = ["(8 - 2) * 4", "7 * 2", "8 * 8"]
    verl = [compute_score("hpc_grpo/countdown", t, gt, format_score=FMT) for t in texts]
    trl = make_trl_reward(format_score=FMT)([[{"role": "assistant", "content": t}] for t in texts], [gt] * 3)
    assert verl == trl == [1.0, FMT, 0.0]
    with pytest.raises(ValueError, match="3 completions but 2 ground truths"):
        make_trl_reward()(texts, [gt] * 2)


# ------------------------------------------------------------------------------------------------ its data
def test_the_preparer_is_deterministic_and_every_problem_is_solvable(tmp_path: Path) -> None:
    a = prepare_countdown(tmp_path / "a", seed=7, train=40, test=10)
    b = prepare_countdown(tmp_path / "b", seed=7, train=40, test=10)
    c = prepare_countdown(tmp_path / "c", seed=8, train=40, test=10)
    assert a.trl_train.read_text() == b.trl_train.read_text() != c.trl_train.read_text()
    rows = [json.loads(line) for line in a.trl_train.read_text().splitlines()]
    test = [json.loads(line) for line in a.trl_test.read_text().splitlines()]
    assert (len(rows), len(test)) == (40, 10)
    assert not {r["ground_truth"] for r in rows} & {r["ground_truth"] for r in test}
    for row in rows:
        numbers, target = parse_ground_truth(row["ground_truth"])
        assert len(numbers) == 4 and target > 0
        assert ", ".join(map(str, numbers)) in row["prompt"][0]["content"]
    assert solvable(*parse_ground_truth(rows[0]["ground_truth"]))


def solvable(numbers: list[int], target: int) -> bool:
    """Brute force over pairwise combinations (independent of how the preparer built the target)."""
    from fractions import Fraction

    def search(values: list[Fraction]) -> bool:
        if any(v == target for v in values):
            return True
        for i in range(len(values)):
            for j in range(len(values)):
                if i != j:
                    rest = [v for k, v in enumerate(values) if k not in (i, j)]
                    a, b = values[i], values[j]
                    for v in (a + b, a - b, a * b) + ((a / b,) if b else ()):
                        if search(rest + [v]):
                            return True
        return False

    return search([Fraction(n) for n in numbers])


def test_hpc_grpo_data_countdown_is_listed_and_writes_into_the_data_root(tmp_path: Path) -> None:
    """The real CLI: the command comes from the registry entry, and without --out it writes $HPC_GRPO_DATA/countdown."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "HPC_GRPO_DATA": str(tmp_path)}
    cli = [sys.executable, "-m", "hpc_grpo.cli", "data"]
    listing = subprocess.run([*cli, "--help"], capture_output=True, text=True, env=env, check=True).stdout
    assert "countdown" in listing and "Generate countdown arithmetic problems" in listing
    help_text = subprocess.run([*cli, "countdown", "--help"], capture_output=True, text=True, env=env,
                               check=True).stdout
    for flag in ("--seed", "--train", "--test", "--numbers", "--out"):
        assert flag in help_text, flag
    run = subprocess.run([*cli, "countdown", "--seed", "3", "--train", "12", "--test", "4"], capture_output=True,
                         text=True, env=env)
    assert run.returncode == 0, run.stderr
    assert "countdown problems from seed 3: 12 train, 4 test rows" in run.stdout
    for rel in ("verl/train.parquet", "verl/test.parquet", "trl/train.jsonl", "trl/test.jsonl"):
        assert (tmp_path / "countdown" / rel).is_file(), rel
    written = (tmp_path / "countdown" / "trl" / "train.jsonl").read_text()
    bad = subprocess.run([*cli, "countdown", "--numbers", "9"], capture_output=True, text=True, env=env)
    assert bad.returncode == 2 and "give 2 to 6" in bad.stderr + bad.stdout, (bad.returncode, bad.stderr)
    assert (tmp_path / "countdown" / "trl" / "train.jsonl").read_text() == written  # nothing half-written


# ------------------------------------------------------------------------------------------------ a run on it
def test_a_countdown_run_plans_with_no_eval_and_no_gsm8k_files(isolated: Path) -> None:
    from hpc_grpo.evaluation.evaluate import describe, summary
    from hpc_grpo.job.trl_job import reward_function
    from hpc_grpo.planning.plan import run_plan

    data = prepare_countdown(isolated / "countdown", seed=0, train=8, test=4)
    # tiny-gsm8k names eval.tasks=[gsm8k]; null leaves them to the reward, as a countdown recipe would
    spec = resolve_spec("tiny-gsm8k", "local", ["grpo.reward=countdown", "grpo.format_score=0.1", "eval.tasks=null",
                                                 f"data.train_files={data.trl_train}",
                                                 f"data.val_files={data.trl_test}"])
    assert spec.recipe.eval.tasks == [] and not spec.recipe.eval.runs
    plan = run_plan(spec, schema=False)
    about_eval = [f for f in plan.findings if f.key.startswith("eval") or "gsm8k" in f.message.lower()]
    assert not about_eval, about_eval
    line = describe(summary(spec))
    assert line.startswith("skipped: grpo.reward=countdown names no eval task"), line
    assert registry.get("countdown").eval_task is None
    # trl builds the entry's reward with the recipe's format score
    reward = reward_function(spec)
    gt = json.loads(data.trl_train.read_text().splitlines()[0])["ground_truth"]
    assert reward(["nothing"], ground_truth=[gt]) == [0.0]
    # a recipe may still name tasks for it: then they run
    named = resolve_spec("tiny-gsm8k", "local", ["grpo.reward=countdown", "eval.tasks=[humaneval]"])
    assert named.recipe.eval.tasks == ["humaneval"] and named.recipe.eval.runs


def test_verl_renders_the_countdown_module_by_its_pkg_path(isolated: Path) -> None:
    from hpc_grpo.engines.verl import modelled_overrides

    spec = resolve_spec("tiny-verl", "local", ["grpo.reward=countdown", "grpo.format_score=0.2"])
    crf = {o.key: o.value for o in modelled_overrides(spec) if "custom_reward_function" in o.key}
    assert crf == {"reward.custom_reward_function.path": "pkg://hpc_grpo.rewards.countdown",
                   "reward.custom_reward_function.name": "compute_score",
                   "+reward.custom_reward_function.reward_kwargs.format_score": 0.2}


def test_evaluating_a_countdown_run_by_hand_asks_for_tasks(isolated: Path) -> None:
    """`hpc-grpo eval RUN` on a run with no eval task: an input error naming --tasks, before any job or process."""
    from hpc_grpo.commands.eval import eval_run
    from hpc_grpo.common.yamlio import SpecError
    from hpc_grpo.launch.render import render_all, write_files

    spec = resolve_spec("tiny-gsm8k", "local", ["grpo.reward=countdown", "eval.tasks=null",
                                                 f"cluster.runs_root={isolated / 'runs'}"], run_name="cd")
    write_files(spec.path, render_all(spec))
    with pytest.raises(SpecError, match=r"no eval task to run: its grpo.reward=countdown names none.*--tasks"):
        eval_run(spec.path, [], False, None, None, here=True)
