"""Bad input is refused with exit code 2 and a message naming the key, and nothing is written.

Each case runs the real CLI entry point in-process, inside a temp dir that is also HOME and the
working directory; afterwards the temp dir holds exactly what the test put there.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from hpc_grpo.cli import app as cli
from tests.conftest import tree

GOOD = """\
name: {name}
engine: verl
model: {{path: Qwen/Qwen2.5-3B-Instruct}}
data: {{train_files: /data/train.parquet, val_files: /data/test.parquet}}
"""

# (id, extra recipe files {name: text}, argv after the command, text the message must contain)
CASES: list[tuple[str, dict[str, str], list[str], str]] = [
    ("malformed-yaml", {"bad": "name: bad\nmodel: [1,\n"}, ["recipe=bad"], "bad.yaml:"),
    ("top-level-list", {"bad": "- a\n- b\n"}, ["recipe=bad"], "top level must be a mapping"),
    ("duplicate-key", {"bad": GOOD.format(name="bad") + "engine: trl\n"}, ["recipe=bad"], "duplicate key 'engine'"),
    ("unknown-top-key", {"bad": GOOD.format(name="bad") + "modle: {}\n"}, ["recipe=bad"], "did you mean 'model'"),
    ("missing-required", {"bad": "name: bad\nengine: verl\ndata: {train_files: a, val_files: b}\n"}, ["recipe=bad"], "model: required"),
    ("extends-cycle", {"a": "extends: b\n", "b": "extends: a\n"}, ["recipe=a"], "extends"),
    ("extends-missing", {"a": "extends: nowhere\n"}, ["recipe=a"], "nowhere"),
    ("wrong-type-in-file", {"bad": GOOD.format(name="bad") + "grpo: {n: five}\n"}, ["recipe=bad"], "grpo.n"),
    ("unknown-nested", {}, ["recipe=qwen2.5-3b-gsm8k-lora", "grpo.group_size=5"], "did you mean 'grpo.n'"),
    ("typo-nested", {}, ["recipe=qwen2.5-3b-gsm8k-lora", "parallel.rolout_tp=1"], "did you mean 'parallel.rollout_tp'"),
    ("n-not-int", {}, ["recipe=qwen2.5-3b-gsm8k-lora", "grpo.n=abc"], "grpo.n"),
    ("n-too-small", {}, ["recipe=qwen2.5-3b-gsm8k-lora", "grpo.n=1"], "grpo.n"),
    ("negative-train", {}, ["recipe=qwen2.5-3b-gsm8k-lora", "batch.train=-4"], "batch.train"),
    ("zero-mini", {}, ["recipe=qwen2.5-3b-gsm8k-lora", "batch.mini=0"], "batch.mini"),
    ("zero-tp", {}, ["recipe=qwen2.5-7b-codegen", "parallel.tp=0"], "parallel.tp"),
    ("health-stop-on-typo", {}, ["recipe=qwen2.5-3b-gsm8k-lora", "health.stop_on=[weight_synk]"],
     "did you mean 'weight_sync'"),
    ("tp-word", {}, ["recipe=qwen2.5-7b-codegen", "parallel.tp=two"], "parallel.tp"),
    ("negative-nodes", {}, ["recipe=qwen2.5-7b-codegen", "resources.nodes=-1"], "resources.nodes"),
    ("bad-time", {}, ["recipe=qwen2.5-7b-codegen", "resources.time=25:99:00"], "resources.time"),
    ("time-word", {}, ["recipe=qwen2.5-7b-codegen", "resources.time=soon"], "resources.time"),
    ("util-above-1", {}, ["recipe=qwen2.5-7b-codegen", "rollout.gpu_memory_utilization=1.5"], "rollout.gpu_memory_utilization"),
    ("lr-zero", {}, ["recipe=qwen2.5-7b-codegen", "grpo.lr=0"], "grpo.lr"),
    ("kl-type", {}, ["recipe=qwen2.5-7b-codegen", "grpo.kl_loss_type=bogus"], "grpo.kl_loss_type"),
    ("backend", {}, ["recipe=qwen2.5-7b-codegen", "backend=deepspeed"], "backend"),
    ("engine", {}, ["recipe=qwen2.5-7b-codegen", "engine=openrlhf"], "engine"),
    ("lora-negative", {}, ["recipe=qwen2.5-3b-gsm8k-lora", "lora.rank=-1"], "lora.rank"),
    ("logger", {}, ["recipe=qwen2.5-3b-gsm8k-lora", "logging.logger=[console,mlflow]"], "logging.logger"),
    ("empty-data", {}, ["recipe=qwen2.5-3b-gsm8k-lora", "data.train_files="], "data.train_files"),
    ("sub-key-of-value", {}, ["recipe=qwen2.5-3b-gsm8k-lora", "model.path.x=1"], "model.path"),
    ("no-equals", {}, ["recipe=qwen2.5-3b-gsm8k-lora", "parallel.tp"], "parallel.tp"),
    ("empty-key", {}, ["recipe=qwen2.5-3b-gsm8k-lora", "=5"], "empty key"),
    ("dashdash-key", {}, ["recipe=qwen2.5-3b-gsm8k-lora", "--", "--algorithm.group_size=5"], "algorithm.group_size"),
    ("no-recipe", {}, ["cluster=local"], "recipe"),
    ("unknown-option", {}, ["recipe=tiny-gsm8k", "--bogus"], "--bogus"),
    ("missing-recipe", {}, ["recipe=nope"], "no recipe named 'nope'"),
    ("missing-cluster", {}, ["recipe=tiny-gsm8k", "cluster=nope"], "no cluster named 'nope'"),
    ("typo-recipe", {}, ["recipe=tiny-gsm8"], "did you mean recipe=tiny-gsm8k?"),
    ("typo-cluster", {}, ["recipe=tiny-gsm8k", "cluster=locl"], "did you mean cluster=local?"),
    ("traversal-recipe", {}, ["recipe=../../etc/passwd"], "recipe"),
    ("traversal-cluster", {}, ["recipe=tiny-gsm8k", "cluster=../clusters/local"], "cluster"),
    ("injection-recipe", {}, ["recipe=x;rm -rf ~"], "recipe"),
    ("traversal-run-name", {}, ["recipe=tiny-gsm8k", "--name", "../../escape"], "run"),
    ("slash-run-name", {}, ["recipe=tiny-gsm8k", "--name", "a/b"], "run"),
    ("injection-run-name", {}, ["recipe=tiny-gsm8k", "--name", "$(touch pwned)"], "run"),
    ("secret-in-env", {}, ["recipe=tiny-gsm8k", "cluster.env.WANDB_API_KEY=x"], "cluster.env"),
    ("bad-env-name", {}, ["recipe=tiny-gsm8k", "cluster.env.BAD-NAME=x"], "cluster.env"),
    ("unset-var-runs-root", {}, ["recipe=tiny-gsm8k", "cluster.runs_root=$HPC_GRPO_NO_SUCH_VAR/runs"], "cluster.runs_root"),
    ("space-runs-root", {}, ["recipe=tiny-gsm8k", "cluster.runs_root=/tmp/my runs"], "cluster.runs_root"),
    ("injection-partition", {}, ["recipe=tiny-gsm8k", "cluster.partition=gpu;touch pwned"], "cluster.partition"),
    ("injection-account", {}, ["recipe=tiny-gsm8k", "resources.account=$(id)"], "resources.account"),
    ("passthrough-key", {}, ["recipe=tiny-gsm8k", "passthrough.a b=1"], "passthrough"),
    ("unknown-cluster-key", {}, ["recipe=tiny-gsm8k", "cluster.gpu_per_node=4"], "did you mean 'gpus_per_node'"),
    ("verl-key-contradicts", {}, ["recipe=qwen2.5-3b-gsm8k-lora", "actor_rollout_ref.rollout.n=8", "grpo.n=4"],
     "actor_rollout_ref.rollout.n=8 and grpo.n=4 are both on the command line and disagree"),
    ("verl-nnodes-other", {}, ["recipe=qwen2.5-3b-gsm8k-lora", "trainer.nnodes=2"], "set resources.nodes=2"),
    ("verl-run-dir", {}, ["recipe=qwen2.5-3b-gsm8k-lora", "trainer.default_local_dir=/ckpt"], "cluster.runs_root"),
    ("verl-adv-estimator", {}, ["recipe=qwen2.5-3b-gsm8k-lora", "algorithm.adv_estimator=gae"],
     "algorithm.adv_estimator=grpo for every GRPO run"),
]


@pytest.mark.parametrize("command", ["plan", "render", "submit"])
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_bad_input_exits_2_and_writes_nothing(case, command, isolated: Path, monkeypatch, capsys) -> None:
    _, files, argv, expected = case
    lib = isolated / "lib" / "recipes"
    lib.mkdir(parents=True)
    for name, text in files.items():
        (lib / f"{name}.yaml").write_text(text)
    monkeypatch.setenv("HPC_GRPO_PATH", str(isolated / "lib"))
    before = tree(isolated)
    extra = {"render": ["-o", str(isolated / "out")], "submit": ["--dry-run"], "plan": []}[command]
    monkeypatch.setattr(sys, "argv", ["hpc-grpo", command, *extra, *argv])
    with pytest.raises(SystemExit) as exc:
        cli.main()
    captured = capsys.readouterr()
    message = captured.err + captured.out
    assert exc.value.code == 2, message
    assert expected in message, message
    assert tree(isolated) == before, "a rejected command wrote files"
    assert not Path("/tmp/pwned").exists()


def test_there_are_at_least_30_cases() -> None:
    assert len(CASES) >= 30
