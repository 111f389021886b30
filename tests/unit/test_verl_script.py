"""The verl launch-script reader (engines/verl_script): what bash would pass to the trainer, read without running
the script, and one message with its line for what it cannot follow. Each construct class has a script of its own
in tests/verl_scripts/constructs/ (written for these tests); the smaller cases are inline."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpc_grpo.engines.verl_script import parse_script

CONSTRUCTS = Path(__file__).resolve().parents[1] / "verl_scripts" / "constructs"


def _read(name: str):
    return parse_script((CONSTRUCTS / name).read_text())


def _value(script, key: str) -> str:
    return next(o.split("=", 1)[1] for o in script.overrides if o.split("=", 1)[0] == key)


def test_arrays_and_a_launcher_array_give_every_element_in_order() -> None:
    s = _read("arrays.sh")
    assert s.errors == [] and s.entry == "verl.trainer.main_ppo"
    keys = [o.split("=", 1)[0] for o in s.overrides]
    assert keys[:3] == ["algorithm.adv_estimator", "data.train_files", "data.val_files"]
    assert "data.max_prompt_length" in keys  # after the comment inside the array
    assert _value(s, "actor_rollout_ref.actor.optim.lr") == "2e-6"
    assert _value(s, "actor_rollout_ref.actor.use_kl_loss") == "True"  # ACTOR+=( ... )
    assert _value(s, "trainer.logger") == '["console"]'
    assert keys[-1] == "trainer.nnodes"  # `2>&1 | tee` is not the trainer's
    assert s.override_lines[keys.index("data.train_files")] == 28  # the line of the call
    assert any("$@" in n for n in s.notes)


def test_arithmetic_is_integer_arithmetic_over_the_scripts_values() -> None:
    s = _read("arithmetic.sh")
    assert s.errors == []
    assert _value(s, "data.max_prompt_length") == "2048"
    assert _value(s, "data.max_response_length") == "4096"  # $(((a + b) * 2))
    assert _value(s, "actor_rollout_ref.actor.ppo_max_token_len_per_gpu") == "6144"  # inside an override
    assert _value(s, "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu") == "3072"  # names, then / truncates


@pytest.mark.parametrize("expr, why", [("__import__('os').system('x')", "not integer arithmetic"),
                                       ("2 ** 1000", "out of range"), ("1 / zero", "divides by zero"),
                                       ("1.5 * 2", "not integer arithmetic")])
def test_arithmetic_that_is_not_plain_integers_is_one_message_with_its_line(expr: str, why: str) -> None:
    s = parse_script(f"A=1\nX=$(({expr}))\npython3 -m verl.trainer.main_ppo trainer.nnodes=$X\n")
    assert len(s.errors) == 1 and s.errors[0].startswith("line 2: ") and why in s.errors[0], s.errors


def test_defaults_and_export_forms() -> None:
    s = _read("defaults_exports.sh")
    assert s.errors == []
    assert _value(s, "actor_rollout_ref.model.path") == "Qwen/Qwen2.5-0.5B-Instruct"  # ${VAR:-default}
    assert _value(s, "actor_rollout_ref.rollout.n") == "4"  # : "${VAR:=default}"
    assert _value(s, "trainer.n_gpus_per_node") == "4"  # ${VAR-default}
    assert s.exports == {"VLLM_USE_V1": "1", "TOKENIZERS_PARALLELISM": "false", "NCCL_DEBUG": "WARN",
                         "HYDRA_FULL_ERROR": "1", "RAY_LOG_TO_STDERR": "1"}
    assert s.ignored == []


def test_command_substitutions_are_never_run_and_are_values_to_fill() -> None:
    s = _read("command_substitution.sh")
    assert s.errors == []
    assert dict(s.placeholders) == {"trainer.n_gpus_per_node": "$(nproc)",
                                    "trainer.experiment_name": "grpo_$(date +%Y%m%d)"}
    assert "$(nproc)" in s.unresolved and any(n.startswith("line 3: $(nproc)") and "not run" in n for n in s.notes)


def test_if_and_case_are_followed_where_the_script_decides_them() -> None:
    s = _read("branches.sh")
    assert s.errors == []
    assert _value(s, "actor_rollout_ref.rollout.gpu_memory_utilization") == "0.6"
    assert _value(s, "trainer.n_gpus_per_node") == "8"  # case cuda|gpu)
    assert any("function now" in n for n in s.notes)


def test_a_value_only_running_the_script_decides_is_an_error_with_both_lines() -> None:
    s = _read("branch_undecided.sh")
    assert len(s.errors) == 1 and s.errors[0].startswith("line 8: ") and "$NNODES" in s.errors[0]
    assert "the `if` at line 3" in s.errors[0]
    assert all(not o.startswith("trainer.nnodes") for o in s.overrides)


def test_placeholders_are_listed_with_their_key() -> None:
    s = _read("placeholders.sh")
    assert s.errors == []
    assert dict(s.placeholders) == {"data.train_files": "/path/to/train.parquet",
                                    "data.val_files": "/path/to/test.parquet",
                                    "actor_rollout_ref.model.path": "<path_to_your_model>",
                                    "trainer.project_name": "TODO"}
    assert _value(s, "trainer.n_gpus_per_node") == "4"  # `<...>` is not read as a redirection


def test_another_trainers_entry_point_is_read_and_named() -> None:
    s = _read("other_entry.sh")
    assert s.errors == [] and s.entry == "recipe.dapo.main_dapo"
    assert _value(s, "reward_model.overlong_buffer.len") == "512"


def test_a_comment_inside_a_continued_call_is_an_error_as_bash_ends_the_call_there() -> None:
    s = _read("broken_continuation.sh")
    assert len(s.errors) == 1 and s.errors[0].startswith("line 7: ") and "outside the trainer call" in s.errors[0]


@pytest.mark.parametrize("text", [
    "python3 -m verl.trainer.main_ppo a.b='unclosed\n",
    "X=$((1 +\n",
    "A=(one two\n",
    "${!x}\npython3 -m verl.trainer.main_ppo a.b=1\n",
    "if [ x ]; then\npython3 -m verl.trainer.main_ppo a.b=1\n",
    "cat <<EOF\npython3 -m verl.trainer.main_ppo a.b=1\nEOF\n",
    "\x00\xff $$ $? ${#} ${@:2} `\n",
    "",
])
def test_no_input_raises(text: str) -> None:
    """Odd input gives messages, never an exception (the import turns errors into one exit-2 message)."""
    s = parse_script(text)
    assert isinstance(s.errors, list) and isinstance(s.overrides, list)


def test_a_trainer_call_in_an_undecided_branch_is_an_error() -> None:
    s = parse_script('if [ -n "$SLURM_JOB_ID" ]; then\n  python3 -m verl.trainer.main_ppo a.b=1\nfi\n')
    assert len(s.errors) == 1 and s.errors[0].startswith("line 2: ") and "line 1" in s.errors[0]


def test_a_here_document_body_is_not_read_as_commands() -> None:
    s = parse_script("cat > x.py <<EOF\nA=(not a command)\nEOF\npython3 -m verl.trainer.main_ppo a.b=1\n")
    assert s.errors == [] and s.overrides == ["a.b=1"] and s.override_lines == [4]


def test_no_trainer_call_is_an_error() -> None:
    s = parse_script("echo hello\n")
    assert len(s.errors) == 1 and "no trainer call" in s.errors[0]
