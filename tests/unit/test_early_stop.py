"""train.early_stop: the plateau rule (job.early_stop.Plateau) and what plan says of a recipe that asks for it."""

from __future__ import annotations

import json
from pathlib import Path

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


VAL = "val-core/openai/gsm8k/acc/mean@1"
VERL_EARLY = [f"train.early_stop.metric={VAL}", "train.early_stop.patience=1", "train.early_stop.min_delta=0.05"]


@pytest.mark.parametrize("overrides,key,words", [
    (["train.test_freq=2"], None, None),  # tiny-verl saves every step
    (["train.test_freq=-1"], "train.test_freq", "train.early_stop needs validations"),
    (["train.test_freq=3", "checkpoint.save_freq=2"], "checkpoint.save_freq",
     "checkpoint.save_freq=2 does not divide train.test_freq=3"),
    (["train.test_freq=4", "checkpoint.save_freq=2"], None, None),
    (["train.test_freq=2", "train.early_stop.metric=eval_reward"], "train.early_stop.metric", "verl logs no eval_reward"),
])
def test_verl_plan_rule(overrides: list[str], key: str | None, words: str | None) -> None:
    """verl stops at a validation step that must be a saved checkpoint, on a key verl logs."""
    spec = resolve_spec("tiny-verl", "local", VERL_EARLY + overrides)
    errors = [f for f in get_engine("verl").check(spec) if f.severity.value == "error"]
    if key is None:
        assert not errors, errors
    else:
        assert [f.key for f in errors] == [key] and words in errors[0].message, errors
        assert errors[0].fix


def verl_rows(accs: dict[int, float], steps: int) -> dict[int, dict[str, object]]:
    """verl's file-logger rows (its own keys): training metrics every step, val-core/val-aux at validation steps."""
    rows: dict[int, dict[str, object]] = {}
    for step in range(1, steps + 1):
        rows[step] = {"actor/pg_loss": 0.01 * step, "critic/score/mean": 0.1, "timing_s/step": 3.0}
        if step in accs:
            rows[step].update({VAL: accs[step], "val-aux/openai/gsm8k/reward/mean@1": accs[step] + 0.1})
    return rows


def test_the_decision_on_verl_rows() -> None:
    """Only the validation rows count; the stop is at the first validation step of the plateau, and a fed row is
    not fed again (the watcher passes the steps after the last it saw)."""
    rule = EarlyStop(metric=VAL, patience=2, min_delta=0.05)
    rows = verl_rows({2: 0.10, 4: 0.30, 6: 0.32, 8: 0.20, 10: 0.50}, steps=10)
    p = Plateau(rule)
    assert p.feed({s: r for s, r in rows.items() if s <= 6}) is None and p.since_best == 1
    assert p.feed(rows, after=6) == 8  # 0.32 and 0.20: two validations no better than 0.30 by more than 0.05
    assert p.seen == [(2, 0.10), (4, 0.30), (6, 0.32), (8, 0.20)] and p.best_step == 4
    assert "early stop at step 8" in p.reason(8) and VAL in p.reason(8)
    assert Plateau(rule).feed(verl_rows({}, steps=10)) is None  # no validation: never a stop


def test_the_replay_stops_at_the_resumed_step() -> None:
    """A requeued verl job replays metrics.jsonl up to the checkpoint it resumes from; later rows were a lost future."""
    rows = verl_rows({1: 0.5, 2: 0.1, 3: 0.1}, steps=3)
    p = Plateau(EarlyStop(metric=VAL, patience=2))
    assert p.feed(rows, until=2) is None and p.since_best == 1 and [s for s, _ in p.seen] == [1, 2]


def test_the_verl_watcher_marks_the_run_trained(tmp_path: Path) -> None:
    """job/verl_early_stop over real files: verl's file logger as it grows, a checkpoint tree at the plateau step
    (and one the driver began after it), then train_done.json with the early_stop record, the history line, and
    the run trained by hpc_grpo.runstate.trained."""
    from hpc_grpo.job.verl_early_stop import VerlEarlyStop
    from hpc_grpo.runstate import checkpoints as ck
    from hpc_grpo.runstate import layout, runs, trained
    from tests import ckpt_trees as trees

    spec = resolve_spec("tiny-verl", "local", VERL_EARLY + ["train.test_freq=1", "train.total_training_steps=8",
                                                            f"cluster.runs_root={tmp_path}"], run_name="es")
    run = spec.path
    run.mkdir(parents=True)
    said: list[str] = []
    watch = VerlEarlyStop(spec, said.append, poll_s=0.01, checkpoint_wait_s=0.5)
    verl_log = layout.verl_log(run)
    lines = [json.dumps({"step": s, "data": r}) for s, r in verl_rows({1: 0.2, 2: 0.22, 3: 0.1}, steps=3).items()]
    verl_log.write_text(lines[0] + "\n")
    assert watch.look() is None
    verl_log.write_text("\n".join(lines) + "\n")
    assert watch.look() == 2
    watch.act(2)
    assert watch.stop_reason is None and "not complete" in said[-1]  # no checkpoint: the run goes on
    trees.verl_fsdp(run, 2, world=1)
    trees.verl_fsdp(run, 3, world=1)
    watch.act(2)
    assert watch.stop_reason and watch.stop_reason.startswith("early stop at step 2")
    done = watch.mark_trained()
    assert done["final_step"] == 2 and done["early_stop"]["best_step"] == 1 and done["max_steps"] == 8
    assert json.loads(layout.done_file(run).read_text())["last_checkpoint"].endswith("global_step_2")
    assert [c.step for c in ck.list_checkpoints(run, "verl")] == [2]  # step 3 moved aside
    assert runs.read_history(run)[-1].purpose == "stopped"
    verdict = trained.decide(spec)
    assert verdict.trained and verdict.step == 2 and "early stop at step 2" in verdict.reason
    from hpc_grpo.commands import report

    assert report.early_stop_reason(run) == done["early_stop"]["reason"]  # report's summary line


def test_the_grpo_config_validates_for_early_stopping() -> None:
    from hpc_grpo.engines.trl import grpo_config_kwargs

    spec = resolve_spec("tiny-gsm8k", "local", ["train.early_stop.patience=2", "train.test_freq=3"])
    kw = grpo_config_kwargs(spec)
    assert kw["eval_strategy"] == "steps" and kw["eval_steps"] == 3 and kw["per_device_eval_batch_size"] % 4 == 0
    assert "eval_strategy" not in grpo_config_kwargs(resolve_spec("tiny-gsm8k", "local", []))
