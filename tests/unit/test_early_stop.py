"""train.early_stop: the plateau rule (job.early_stop.Plateau) and what plan says of a recipe that asks for it."""

from __future__ import annotations

import pytest

from hpc_grpo.config.resolve import resolve_spec
from hpc_grpo.config.spec import EarlyStop
from hpc_grpo.engines import get_engine
from hpc_grpo.job.early_stop import Plateau


def feed(plateau: Plateau, values: list[float]) -> int | None:
    """The step (10, 20, ...) at which the rule says stop, or None."""
    for i, v in enumerate(values, 1):
        if plateau.update(10 * i, v):
            return 10 * i
    return None


def test_patience_counts_validations_since_the_best() -> None:
    assert feed(Plateau(EarlyStop(patience=2)), [0.1, 0.3, 0.2, 0.3, 0.25]) == 40  # 0.3 is not better than 0.3
    assert feed(Plateau(EarlyStop(patience=2)), [0.1, 0.3, 0.2, 0.4, 0.35, 0.5]) is None  # each dip recovered


def test_min_delta_and_mode() -> None:
    p = Plateau(EarlyStop(patience=1, min_delta=0.05))
    assert feed(p, [0.50, 0.54]) == 20  # +0.04 is not more than 0.05
    assert p.best == 0.50 and p.best_step == 10
    assert feed(Plateau(EarlyStop(patience=1, mode="min")), [1.0, 0.8, 0.9]) == 30
    assert "best 0.5 at step 10" in p.reason(20)


def test_a_replay_goes_on_counting() -> None:
    """A resumed job replays the validations logged before it: the count is not reset by a requeue."""
    p = Plateau(EarlyStop(patience=3))
    feed(p, [0.4, 0.3, 0.35])
    assert p.since_best == 2 and p.update(40, 0.39)


@pytest.mark.parametrize("overrides,key,words", [
    (["train.early_stop.patience=2"], "train.test_freq", "train.early_stop needs validations"),
    (["train.early_stop.patience=2", "train.test_freq=2"], None, None),
])
def test_trl_needs_validations(overrides: list[str], key: str | None, words: str | None) -> None:
    spec = resolve_spec("tiny-gsm8k", "local", overrides)
    errors = [f for f in get_engine("trl").check(spec) if f.severity.value == "error"]
    if key is None:
        assert not errors, errors
    else:
        assert [f.key for f in errors] == [key] and words in errors[0].message


def test_verl_refuses_early_stop() -> None:
    spec = resolve_spec("tiny-verl", "local", ["train.early_stop.patience=2", "train.test_freq=2"])
    errors = [f for f in get_engine("verl").check(spec) if f.key == "train.early_stop"]
    assert errors and "no early stopping yet" in errors[0].message and "engine=trl" in errors[0].fix


def test_the_grpo_config_validates_for_early_stopping() -> None:
    from hpc_grpo.engines.trl import grpo_config_kwargs

    spec = resolve_spec("tiny-gsm8k", "local", ["train.early_stop.patience=2", "train.test_freq=3"])
    kw = grpo_config_kwargs(spec)
    assert kw["eval_strategy"] == "steps" and kw["eval_steps"] == 3 and kw["per_device_eval_batch_size"] % 4 == 0
    assert "eval_strategy" not in grpo_config_kwargs(resolve_spec("tiny-gsm8k", "local", []))
