"""A W&B group per sweep: recipe logging.group reaches W&B in both engines' jobs, and every member of a sweep is
in the group named by the sweep.

Neither engine passes a group to wandb.init (verl's Tracking calls wandb.init(project, name, entity, config,
settings); transformers' WandbCallback passes one only in a hyperparameter search), and wandb takes WANDB_RUN_GROUP
from the environment then (checked by hand, offline, with the pinned verl's Tracking and transformers' WandbCallback: the
run's group was the variable's value). So the tests check that the variable is in each job's environment: the trl
job's W&B environment, and verl's TaskRunner's (Ray's runtime_env, where verl's tracking runs) in the rendered
launch script.
"""

from __future__ import annotations

from pathlib import Path

from hpc_grpo.cli.run_cmds import wandb_line, wandb_run
from hpc_grpo.commands.sweep import resolve_member
from hpc_grpo.config.resolve import resolve_spec
from hpc_grpo.job.trl_job import wandb_env
from hpc_grpo.launch.render import render_all
from hpc_grpo.runstate import layout
from hpc_grpo.runstate.sweeps import Member

GROUP_VAR = "+ray_kwargs.ray_init.runtime_env.env_vars.WANDB_RUN_GROUP"


def test_trl_job_environment_names_the_group(tmp_path: Path) -> None:
    on = ["logging.logger=[console,wandb]", f"cluster.runs_root={tmp_path}"]
    spec = resolve_spec("tiny-gsm8k", "local", [*on, "logging.group=lr-sweep"], run_name="t")
    assert wandb_env(spec)["WANDB_RUN_GROUP"] == "lr-sweep"
    assert "WANDB_RUN_GROUP" not in wandb_env(resolve_spec("tiny-gsm8k", "local", on, run_name="t"))
    off = resolve_spec("tiny-gsm8k", "local", [f"cluster.runs_root={tmp_path}", "logging.group=lr-sweep"], run_name="t")
    assert wandb_env(off) == {}  # W&B is not a logger: nothing of it in the job


def test_verl_taskrunner_environment_names_the_group() -> None:
    base = ["cluster.runs_root=/runs", "logging.logger=[console,wandb]"]
    launch = render_all(resolve_spec("tiny-verl-math", "slurm-dev", [*base, "logging.group=lr-sweep"],
                                     run_name="v"))["scripts/launch.sh"]
    assert f"  {GROUP_VAR}=lr-sweep" in launch.splitlines(), launch
    assert GROUP_VAR not in render_all(resolve_spec("tiny-verl-math", "slurm-dev", base, run_name="v"))["scripts/launch.sh"]
    without_wandb = resolve_spec("tiny-verl-math", "slurm-dev", ["cluster.runs_root=/runs", "logging.group=lr-sweep"],
                                 run_name="v")
    assert GROUP_VAR not in render_all(without_wandb)["scripts/launch.sh"]


def test_every_sweep_member_joins_the_sweeps_group(tmp_path: Path) -> None:
    member = Member(1, layout.member_name("lr", 1), ["grpo.lr=2e-2"])
    base = [f"cluster.runs_root={tmp_path}", "logging.logger=[console,wandb]"]
    spec = resolve_member("tiny-gsm8k", "slurm-dev", base, member, tmp_path / "lr", [], "lr")
    assert spec.recipe.logging.group == "lr" and spec.recipe.grpo.lr == 2e-2
    assert spec.run_name == "lr-m1" and wandb_env(spec)["WANDB_RUN_GROUP"] == "lr"
    wb = wandb_run(spec)
    assert wb is not None and wb["group"] == "lr" and wandb_line(wb).endswith(", group lr")
    # a group given on the command line wins
    mine = resolve_member("tiny-gsm8k", "slurm-dev", [*base, "logging.group=mine"], member, None, [], "lr")
    assert mine.recipe.logging.group == "mine"
    assert wandb_run(resolve_spec("tiny-gsm8k", "local", [f"cluster.runs_root={tmp_path}"])) is None
