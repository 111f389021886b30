"""The rewards a recipe can name (grpo.reward), each in one entry: where verl and trl find it, the settings it is
called with, the data it expects, what evaluates it, and whether it runs model-written code.

Plain data and import paths as strings: config.spec validates grpo.reward against it and plan reads it, neither of
which may import a reward (a reward module may pull its sandbox or numeric code). Adding a reward is one module under
hpc_grpo/rewards/ (its scorer, trl factory and, for a new data set, the preparer) plus one `register(Reward(...))`
at the end of this file; its DataSet makes its `hpc-grpo data NAME` command (hpc_grpo/cli/data_cmds.py).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from hpc_grpo.common.loading import load_object
from hpc_grpo.config.data_sets import CODEGEN, GSM8K, MATH, DataOption, DataSet

# recipe -> {kwarg: (value, the recipe key it comes from)}: verl gets them as reward_kwargs, trl's factory as kwargs
Kwargs = Callable[[Any], dict[str, tuple[object, str]]]


def _no_kwargs(recipe: Any) -> dict[str, tuple[object, str]]:
    return {}


@dataclass(frozen=True, slots=True)
class Reward:
    """One reward: `module` holds verl's `compute_score` (loaded as pkg://module) and trl's factory."""

    name: str
    module: str  # hpc_grpo.rewards.X
    trl_factory: str  # a function of `module`: factory(**kwargs, **trl_kwargs) -> trl reward function
    # hpc_grpo.config.eval_tasks name evaluated when the recipe sets no eval.tasks; None: the reward trains no skill
    # an eval task measures, and a recipe that sets no eval.tasks is not evaluated after training
    eval_task: str | None
    data: DataSet  # the rows it scores: `hpc-grpo data <data.name>` writes them
    kwargs: Kwargs = _no_kwargs
    trl_kwargs: Callable[[Any], dict[str, object]] | None = None  # trl only (e.g. worker count)
    runs_code: bool = False  # executes model-written code: the sandbox's isolation is checked at job start
    ground_truth_check: str | None = None  # "module:function" raising ValueError/TypeError on a foreign row
    # verl's own scorer for the data's data_source gives the same scores: no custom_reward_function rendered
    verl_builtin: Callable[[Any], bool] = field(default=lambda recipe: False)

    @property
    def verl_path(self) -> str:
        return f"pkg://{self.module}"

    @property
    def data_command(self) -> str:
        return self.data.name

    verl_function = "compute_score"


_REWARDS: dict[str, Reward] = {}


def register(reward: Reward) -> Reward:
    """Add (or, in a test, replace) a reward; the name is what grpo.reward takes."""
    _REWARDS[reward.name] = reward
    return reward


def unregister(name: str) -> None:
    """Remove a reward (tests that registered a fake one clean up with this)."""
    _REWARDS.pop(name, None)


def names() -> tuple[str, ...]:
    return tuple(_REWARDS)


def get(name: str) -> Reward:
    """The entry for a grpo.reward value; KeyError names the known ones (config.spec reports it first)."""
    try:
        return _REWARDS[name]
    except KeyError:
        raise KeyError(f"unknown reward {name!r}: known rewards are {', '.join(_REWARDS)}") from None


def all_rewards() -> Iterator[Reward]:
    return iter(tuple(_REWARDS.values()))


def trl_reward(recipe: Any) -> Callable[..., list[float]]:
    """The recipe's reward function for trl's GRPOTrainer, built by its entry's factory."""
    entry = get(recipe.grpo.reward)
    kwargs: dict[str, object] = {k: v for k, (v, _) in entry.kwargs(recipe).items()}
    if entry.trl_kwargs is not None:
        kwargs.update(entry.trl_kwargs(recipe))
    factory = load_object(f"{entry.module}:{entry.trl_factory}")  # the job's import, never plan's
    return factory(**kwargs)


# ------------------------------------------------------------------------------------------------ entries
def _gsm8k_kwargs(recipe: Any) -> dict[str, tuple[object, str]]:
    g = recipe.grpo
    return {"method": (g.reward.removeprefix("gsm8k_"), "grpo.reward"), "format_score": (g.format_score, "grpo.format_score")}


def _format_score(recipe: Any) -> dict[str, tuple[object, str]]:
    return {"format_score": (recipe.grpo.format_score, "grpo.format_score")}


def _code_kwargs(recipe: Any) -> dict[str, tuple[object, str]]:
    return {k: (v, f"grpo.code.{k}") for k, v in recipe.grpo.code.model_dump().items()}


_GSM8K: dict[str, Any] = dict(module="hpc_grpo.rewards.gsm8k", trl_factory="make_trl_reward", eval_task="gsm8k", data=GSM8K,
              kwargs=_gsm8k_kwargs)
# verl's built-in GSM8K scorer (data_source openai/gsm8k) is the strict one with format score 0
register(Reward("gsm8k_strict", **_GSM8K, verl_builtin=lambda r: not r.grpo.format_score))
register(Reward("gsm8k_flexible", **_GSM8K))
register(Reward("code_exec", module="hpc_grpo.rewards.code", trl_factory="make_trl_reward", eval_task="humaneval",
                data=CODEGEN, kwargs=_code_kwargs,
                trl_kwargs=lambda r: {"workers": r.resources.cpus_per_task}, runs_code=True,
                ground_truth_check="hpc_grpo.rewards.code:parse_ground_truth"))
register(Reward("math_boxed", module="hpc_grpo.rewards.math_boxed", trl_factory="make_trl_reward", eval_task="math",
                data=MATH, kwargs=_format_score))
# Countdown: reach the target from the given numbers; problems generated from a seed, no eval task.
register(Reward("countdown", module="hpc_grpo.rewards.countdown", trl_factory="make_trl_reward", eval_task=None,
                data=DataSet("countdown", "hpc_grpo.rewards.countdown:prepare_countdown",
                             "Generate countdown arithmetic problems (reach the target from the given numbers) from a "
                             "seed, in verl's parquet format and the trl engine's jsonl format; nothing is downloaded.",
                             "countdown problems",
                             (DataOption("seed", int, 0, "random seed: the same seed writes the same problems"),
                              DataOption("train", int, 2000, "problems in the train split"),
                              DataOption("test", int, 200, "problems in the test split"),
                              DataOption("numbers", int, 4, "numbers per problem (2 to 6)"))),
                kwargs=_format_score, ground_truth_check="hpc_grpo.rewards.countdown:parse_ground_truth"))
