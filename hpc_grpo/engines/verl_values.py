"""The values verl and vLLM check only at run time, checked by plan before the queue.

verl's YAMLs carry no enumerations and its dataclasses' types (engines/verl_dataclasses) say `str` for a loss
mode: a misspelt `loss_agg_mode`, KL type or advantage estimator passes Hydra and fails when the job first builds
the actor or computes a loss, hours later on a busy cluster. The names verl accepts are read from its own source
with `ast` (never imported, so plan stays free of torch):

- loss aggregation modes: the list ActorConfig.__post_init__ checks (`workers/config/actor.py`);
- advantage estimators: `AdvantageEstimator`'s values and every `register_adv_est(...)` name (`core_algos.py`);
- policy-loss modes: every `register_policy_loss(...)` name;
- KL types: the names `kl_penalty_forward` compares `kl_penalty` with, less those whose branch only raises, each
  also with verl's "+" suffix (straight-through gradient: `kl_penalty` strips it).

vLLM refuses sampling parameters when the first request is made (`SamplingParams._verify_args` in the vLLM the job
runs): top_p in (0, 1], top_k -1, 0 or >= 1 and an integer, temperature in [0, 2], min_p in [0, 1], max_tokens >= 1.
verl passes the rollout's temperature/top_p/top_k (and their `val_kwargs` copies for validation) to vLLM as they
are. Clip ratios are not checked by verl: a negative one runs with a clip range that excludes the ratio 1
(the policy that generated the batch), so plan refuses it as its own rule, and dual-clip's clip_ratio_c must be
above 1 (verl asserts it in the loss). tests/unit/test_verl_values_parity.py runs verl's and vLLM's own code in
`.venv-verl` on the same values.
"""

from __future__ import annotations

import ast
import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from hpc_grpo.common.findings import Finding, error
from hpc_grpo.engines.verl_dataclasses import parse_value, verl_root

ARR = "actor_rollout_ref"
ROLLOUT = f"{ARR}.rollout"
ACTOR = f"{ARR}.actor"


@dataclass(frozen=True)
class Choices:
    """The names verl accepts, each with the source file it was read from."""

    loss_agg_modes: tuple[str, ...]
    adv_estimators: tuple[str, ...]
    policy_losses: tuple[str, ...]
    kl_types: tuple[str, ...]


def _strings(node: ast.AST) -> list[str]:
    return [n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str)]


def _function(tree: ast.Module, name: str) -> ast.FunctionDef | None:
    return next((n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == name), None)


def _decorated(tree: ast.Module, decorator: str, enum_values: dict[str, str]) -> list[str]:
    """The first argument of every `@decorator(...)`: a string, or an `Enum.MEMBER` looked up in enum_values."""
    out: list[str] = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.FunctionDef):
            continue
        for dec in node.decorator_list:
            if isinstance(dec, ast.Call) and isinstance(dec.func, ast.Name) and dec.func.id == decorator and dec.args:
                arg = dec.args[0]
                if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                    out.append(arg.value)
                elif isinstance(arg, ast.Attribute) and arg.attr in enum_values:
                    out.append(enum_values[arg.attr])
    return out


def _kl_types(tree: ast.Module) -> list[str]:
    func = _function(tree, "kl_penalty_forward")
    if func is None:
        return []
    names: list[str] = []
    for node in ast.walk(func):
        if not isinstance(node, ast.If) or not isinstance(node.test, ast.Compare):
            continue
        left = node.test.left
        if not (isinstance(left, ast.Name) and left.id == "kl_penalty"):
            continue
        if all(isinstance(s, ast.Raise) for s in node.body):
            continue  # "full": verl raises NotImplementedError
        names += _strings(node.test.comparators[0]) if node.test.comparators else []
    return names + [f"{n}+" for n in names]


@lru_cache(maxsize=4)
def choices(config_dir: Path) -> Choices | None:
    """verl's names, read from the installed verl's source; None when the files are not where this verl keeps them."""
    root = verl_root(config_dir)
    try:
        actor = ast.parse((root / "workers" / "config" / "actor.py").read_text())
        algos = ast.parse((root / "trainer" / "ppo" / "core_algos.py").read_text())
    except (OSError, SyntaxError):
        return None
    modes: list[str] = []
    for node in ast.walk(actor):
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "valid_loss_agg_modes"
                                                for t in node.targets):
            modes = _strings(node.value)
    enum = next((n for n in algos.body if isinstance(n, ast.ClassDef) and n.name == "AdvantageEstimator"), None)
    enum_values: dict[str, str] = {}
    for stmt in enum.body if enum else []:
        if isinstance(stmt, ast.Assign) and isinstance(stmt.value, ast.Constant) and isinstance(stmt.value.value, str):
            enum_values[stmt.targets[0].id] = stmt.value.value  # type: ignore[attr-defined]
    estimators = list(enum_values.values()) + _decorated(algos, "register_adv_est", enum_values)
    losses = _decorated(algos, "register_policy_loss", {})
    return Choices(tuple(dict.fromkeys(modes)), tuple(dict.fromkeys(estimators)), tuple(dict.fromkeys(losses)),
                   tuple(dict.fromkeys(_kl_types(algos))))


# ------------------------------------------------------------------------------------------------ the rules
Rule = Callable[[object], str | None]  # the value -> what is wrong with it, None when it is fine


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def _range(low: float | None, high: float | None, low_open: bool = False, what: str = "") -> Rule:
    def rule(value: object) -> str | None:
        v = _number(value)
        if v is None:
            return None  # a type the dataclass check judges
        if not math.isfinite(v):
            return f"must be a finite number{what}"
        bad_low = low is not None and (v <= low if low_open else v < low)
        bad_high = high is not None and v > high
        if bad_low or bad_high:
            lo = "" if low is None else ("(" if low_open else "[") + f"{low:g}"
            hi = "" if high is None else f"{high:g}]"
            span = f"in {lo}, {hi}" if low is not None and high is not None else (
                f">= {low:g}" if high is None and not low_open else f"> {low:g}" if high is None else f"<= {high:g}")
            return f"must be {span}{what}"
        return None
    return rule


def _top_k(value: object) -> str | None:
    if isinstance(value, bool) or not isinstance(value, int):
        return "must be an integer: -1 or 0 (off) or at least 1 (vLLM)" if isinstance(value, float) else None
    return "must be -1 or 0 (off) or at least 1 (vLLM)" if value < -1 else None


def _one_of(names: tuple[str, ...]) -> Rule:
    def rule(value: object) -> str | None:
        if not isinstance(value, str) or "${" in value or value in names:
            return None
        return f"is not one verl has: {', '.join(names)}"
    return rule


VLLM = " (vLLM refuses the sampling parameters at the first request)"
NONSENSE = " (verl runs it: the clip range then excludes the ratio 1 of the policy that generated the batch)"


def rules(names: Choices | None) -> dict[str, tuple[Rule, str]]:
    """verl key -> (its rule, the fix). Sampling keys for training and for validation (val_kwargs)."""
    table: dict[str, tuple[Rule, str]] = {}
    for prefix in (ROLLOUT, f"{ROLLOUT}.val_kwargs"):
        table[f"{prefix}.top_p"] = (_range(0.0, 1.0, low_open=True, what=VLLM), "use a value in (0, 1]; 1.0 is off")
        table[f"{prefix}.top_k"] = (_top_k, "use -1 (off) or a count of tokens such as 50")
        table[f"{prefix}.temperature"] = (_range(0.0, 2.0, what=VLLM), "use a value in [0, 2]; 1.0 samples as trained")
        table[f"{prefix}.min_p"] = (_range(0.0, 1.0, what=VLLM), "use a value in [0, 1]; 0 is off")
    table["data.max_response_length"] = (_range(1.0, None, what=" (vLLM's max_tokens must be at least 1)"),
                                         "generate at least one token")
    for name in ("clip_ratio", "clip_ratio_low", "clip_ratio_high"):
        table[f"{ACTOR}.{name}"] = (_range(0.0, None, what=NONSENSE), f"use a ratio >= 0 such as 0.2 ({name})")
    table[f"{ACTOR}.clip_ratio_c"] = (_range(1.0, None, low_open=True, what=" (verl asserts it in the dual-clip loss)"),
                                      "use a value above 1, such as verl's default 3.0")
    if names is not None:
        table[f"{ACTOR}.loss_agg_mode"] = (_one_of(names.loss_agg_modes), "use one of verl's loss aggregation modes")
        table[f"{ACTOR}.policy_loss.loss_mode"] = (_one_of(names.policy_losses), "use one of verl's policy losses")
        table["algorithm.adv_estimator"] = (_one_of(names.adv_estimators), "use one of verl's advantage estimators")
        table[f"{ACTOR}.kl_loss_type"] = (_one_of(names.kl_types), "use one of verl's KL types, e.g. low_var_kl")
        table["algorithm.kl_penalty"] = (_one_of(names.kl_types), "use one of verl's KL types, e.g. kl")
    return table


def value_check(overrides: list[str], config_dir: Path, recipe_keys: dict[str, str] | None = None) -> list[Finding]:
    """Each override's value against verl's and vLLM's run-time rules. recipe_keys: verl key -> the recipe key it
    is rendered from, named in the fix so the user edits what they typed."""
    table = rules(choices(config_dir))
    out: list[Finding] = []
    for item in overrides:
        key, sep, text = item.partition("=")
        key = key.lstrip("+")
        if not sep or key not in table:
            continue
        rule, fix = table[key]
        value = parse_value(text)
        problem = rule(value)
        if problem:
            source = (recipe_keys or {}).get(key)
            where = f" (set by recipe key {source})" if source else ""
            out.append(error(f"engine.{key}", f"{key}={text}{where} {problem}", f"{fix}: set "
                             f"{source or key}=<value>"))
    return out
